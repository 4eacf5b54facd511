"""Two-process DDP on CPU (torchrun, gloo): training completes and advantages match one-process GRPO."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from harness import TESTS, run_offline

from trl_multiagent.training.advantages import group_advantages


def torchrun_two_processes(worker: str, model_dir: str, output_dir, *, port: int) -> None:
    """``tests/workers/<worker> <model_dir> <output_dir>`` in two processes (torchrun, gloo); a rank waiting on the
    other times out."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    run_offline([*command, str(TESTS / "workers" / worker), model_dir, str(output_dir)])


@pytest.mark.slow
def test_torchrun_two_processes(tiny_model_dir, tmp_path):
    torchrun_two_processes("ddp_worker.py", tiny_model_dir, tmp_path, port=29517)

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world_size"] == 2 and r["steps"] == 2 for r in ranks)
    for step in range(2):
        rewards = ranks[0]["rewards"][step]
        assert rewards == ranks[1]["rewards"][step]  # both ranks see every episode's reward
        expected = group_advantages(torch.tensor(rewards), num_generations=4).tolist()
        assert any(abs(a) > 0 for a in expected)
        covered = set()
        for r in ranks:
            for episode, advantage in r["local"][step]:
                assert abs(advantage - expected[episode]) < 1e-6
                covered.add(episode)
        assert covered == set(range(len(rewards)))  # every episode of the global batch trained on some rank


@pytest.mark.slow
def test_ranks_whose_episodes_make_different_numbers_of_calls_train_together(tiny_model_dir, tmp_path):
    """Eval-Opt's ranks make different numbers of calls (rank 0's evaluator rejects, rank 1's accepts): training
    and evaluation run in step on both, and DDP keeps the replicas equal."""
    torchrun_two_processes("uneven_ranks_worker.py", tiny_model_dir, tmp_path, port=29519)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["steps"] for r in ranks] == [2, 2]
    assert ranks[0]["after"] == ranks[1]["after"]
    moved = [name for name, weights in ranks[0]["after"].items() if weights != ranks[0]["before"][name]]
    assert any("generator" in name for name in moved) and any("evaluator" in name for name in moved)
    assert all(math.isfinite(loss) for r in ranks for loss in r["losses"] + [r["eval_loss"]])


# Two ZeRO ranks against two DDP ranks on the uneven episodes above, max |difference| of any LoRA weight after 2 steps:
# measured (2026-12-01, beta 0.05) ZeRO-2 6.9e-6, ZeRO-3 2.7e-4 and 2.8e-4 (two runs). The bound is 2% of one Adam
# step (lr 5e-2), as in test_deepspeed_role_models.py: a forward trained twice or a padding row that trained would be
# a whole step off.
UNEVEN_ZERO_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def uneven_ranks_under_ddp(tiny_model_dir, tmp_path_factory):
    ddp_dir = tmp_path_factory.mktemp("uneven-ddp")
    torchrun_two_processes("uneven_ranks_worker.py", tiny_model_dir, ddp_dir, port=29541)
    return ddp_dir


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_uneven_ranks_under_zero_train_as_under_ddp(
    tiny_model_dir, tmp_path, extensions_dir, uneven_ranks_under_ddp, stage
):
    """The same uneven Eval-Opt ranks, each through its DeepSpeed engine (`accelerate launch --use_deepspeed`): both
    ranks end with the adapters DDP ends with, whatever the forwards' padding and stand-ins."""
    pytest.importorskip("deepspeed", reason="install the test extras: pip install -e '.[test]'")
    ddp_dir, zero_dir = uneven_ranks_under_ddp, tmp_path / f"zero{stage}"
    zero_dir.mkdir()
    accelerate = str(Path(sys.executable).parent / "accelerate")
    launch = [accelerate, "launch", "--use_deepspeed", "--zero_stage", str(stage), "--num_processes", "2"]
    launch += ["--mixed_precision", "no", "--main_process_port", str(29542 + stage)]
    worker = str(TESTS / "workers" / "uneven_ranks_worker.py")
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": extensions_dir}
    run_offline([*launch, worker, tiny_model_dir, str(zero_dir)], env=env, timeout=900)
    ddp = json.loads((ddp_dir / "rank0.json").read_text())
    for rank in range(2):
        zero = json.loads((zero_dir / f"rank{rank}.json").read_text())
        assert zero["steps"] == 2 and zero["after"].keys() == ddp["after"].keys()
        worst = max(
            max(abs(a - b) for a, b in zip(zero["after"][name], weights)) for name, weights in ddp["after"].items()
        )
        print(f"ZeRO-{stage} rank {rank}: max |adapter - DDP's| = {worst:.2e}")
        assert worst <= UNEVEN_ZERO_TOLERANCE
