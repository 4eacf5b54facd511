"""Two-process DDP on CPU (torchrun, gloo): training completes and advantages match one-process GRPO."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trl_multiagent.training.advantages import group_advantages


def test_torchrun_two_processes(tiny_model_dir, tmp_path):
    tests_dir = Path(__file__).parent
    env = {
        **os.environ,
        "PYTHONPATH": f"{tests_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        str(tests_dir / "workers" / "ddp_worker.py"),
        tiny_model_dir,
        str(tmp_path),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]

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
