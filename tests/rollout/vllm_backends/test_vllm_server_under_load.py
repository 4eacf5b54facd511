"""A server under many calls at once: the client never has more requests open on it than `vllm_server_max_concurrency`,
an answer cut short is asked again (the episode records one answer), and an answer that arrived whole but is not a
completion stops the rollout naming the server, what it answered and how to resume, never a bare KeyError.

Stand-in servers on 127.0.0.1 (tests/vllm_stand_in.py); no vLLM needed. The same faults against a real `vllm serve`
at 64 calls in flight: test_vllm_server_faults.py.
"""

from __future__ import annotations

import functools

import pytest
from peft import get_peft_model
from tiny import tiny_lora
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_stand_in import start_stand_in, stop_stand_in

from trl_multiagent import EvalOpt
from trl_multiagent.checkpoints.resume_command import resume_advice
from trl_multiagent.rollout.backends import vllm_server
from trl_multiagent.rollout.backends.vllm_server import ServerLostError, VLLMServerBackend
from trl_multiagent.rollout.engine import EpisodeError, RolloutEngine

ROLES = ("generator", "evaluator")


@pytest.fixture
def stand_in():
    server, url = start_stand_in()
    yield server, url
    stop_stand_in(server)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(vllm_server, "_RETRY_DELAYS", (0.01, 0.01))


@pytest.fixture(scope="module")
def peft_model(tiny_model_dir):
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_lora(), adapter_name=ROLES[0])
    model.add_adapter(ROLES[1], tiny_lora())
    return model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def rollout(url, tokenizer, peft_model, episodes: int, **kwargs):
    backend = VLLMServerBackend(url, tokenizer, ROLES, {"max_tokens": 1}, [0], timeout=10, **kwargs)
    backend.sync_adapters(peft_model)
    engine = RolloutEngine(EvalOpt(max_iterations=1), backend, dict(zip(ROLES, ROLES)), mode="async")
    prompts = [[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(episodes)]
    return backend, engine, prompts


@pytest.mark.parametrize("bound", [1, 4])
def test_the_server_never_holds_more_requests_than_the_bound(bound, stand_in, tokenizer, peft_model):
    server, url = stand_in
    server.hold = bound + 1  # completions wait for one more than the bound: a client over it would reach it
    backend, engine, prompts = rollout(url, tokenizer, peft_model, episodes=16, max_concurrency=bound)
    episodes = engine.run(prompts)
    assert server.peak == bound  # reached, never passed (the wait for one more ran out)
    assert [len(e.calls) for e in episodes] == [2] * 16 and server.seen["/v1/completions"] == 32
    backend.close()


def test_an_answer_cut_short_is_asked_again_and_recorded_once(stand_in, tokenizer, peft_model):
    server, url = stand_in
    backend, engine, prompts = rollout(url, tokenizer, peft_model, episodes=8)
    server.mode = "cut"  # the first completion's answer stops half-way, then the server answers as usual
    episodes = engine.run(prompts)
    assert [len(e.calls) for e in episodes] == [2] * 8  # every episode whole, each call once
    assert server.seen["/v1/completions"] == 16 + 1  # the cut one was sent twice
    assert len(server.served) == 16
    backend.close()


def test_an_answer_that_is_not_a_completion_stops_naming_the_server_and_the_resume(
    stand_in, tokenizer, peft_model, tmp_path
):
    server, url = stand_in
    advice = functools.partial(resume_advice, str(tmp_path / "run"))
    backend, engine, prompts = rollout(url, tokenizer, peft_model, episodes=8, next_steps=advice)
    server.mode = "garbage"
    with pytest.raises(EpisodeError) as stopped:
        engine.run(prompts)
    lost = stopped.value.__cause__
    assert isinstance(lost, ServerLostError) and lost.cause == "garbled" and lost.url == url
    message = str(lost)
    assert message.startswith(f"vLLM server {url} answered /v1/completions with a body that is not a completion")
    assert '\'{"id": "cmpl-1", "choices": [{"tok\'' in message  # what it answered, for the user to see
    assert "trl-multiagent vllm-serve --config <your training yaml>" in message and advice() in message
    assert server.seen["/v1/completions"] <= 8  # not retried: one answer each at most, then the rollout stopped
    assert backend._loop.in_flight() == 0  # every other call was cancelled before the error was raised
    backend.close()
