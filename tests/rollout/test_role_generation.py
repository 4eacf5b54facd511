"""Per-role generation settings (`role_generation_kwargs`): the engine puts a role's settings on each of its calls,
and the transformers backend generates those calls with them (the vLLM side:
tests/rollout/vllm_backends/test_vllm_backend.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from scripted import ScriptedBackend
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, Voting
from trl_multiagent.checkpoints import load_base_workflow
from trl_multiagent.evaluation import eos_token_ids, make_generation_config
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend
from trl_multiagent.rollout.engine import RolloutEngine

QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]
EVALUATOR = {"temperature": 0.0, "max_tokens": 3, "stop": ["</verdict>"]}


def test_engine_puts_each_roles_settings_on_its_calls(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = ScriptedBackend(tokenizer, lambda requests, rng: ["\\boxed{Incorrect}"] * len(requests))
    engine = RolloutEngine(
        EvalOpt(max_iterations=2), backend, {"generator": "g", "evaluator": "e"}, {"evaluator": EVALUATOR}
    )
    engine.run([QUESTION])
    settings = [(request.adapter, request.generation_kwargs) for request in backend.requests]
    assert settings == [("g", {}), ("e", EVALUATOR), ("g", {}), ("e", EVALUATOR)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"judge": {"temperature": 0.3}}, "names role"),
        ({"evaluator": {"temp": 0.3}}, "unknown setting"),
        ({"evaluator": {"stop": "</verdict>"}}, "list of non-empty strings"),
    ],
)
def test_bad_role_generation_kwargs_fail_early(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutEngine(
            EvalOpt(),
            backend=None,
            adapter_for_role={"generator": "g", "evaluator": "e"},
            role_generation_kwargs=kwargs,
        )


def test_config_accepts_role_generation_kwargs_as_json(tmp_path):
    args = MultiAgentGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, role_generation_kwargs='{"evaluator": {"max_tokens": 5}}'
    )
    assert args.role_generation_kwargs == {"evaluator": {"max_tokens": 5}}


@pytest.fixture(scope="module")
def spied(tiny_model_dir):
    """The tiny model behind every role, its `generate` recording the generation config of each call."""
    trained = load_base_workflow(tiny_model_dir, Voting())
    seen = []
    original = trained.model.generate

    def generate(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    trained.model.generate = generate
    config = make_generation_config(trained, max_new_tokens=8)  # greedy
    backend = TransformersBackend(
        lambda: contextlib.nullcontext(trained.model),
        trained.tokenizer,
        trained.router,
        config,
        eos_token_ids(trained),
    )
    return backend, seen


def test_transformers_backend_generates_with_the_requests_settings(spied):
    backend, seen = spied
    seen.clear()
    default, short = backend.generate(
        [GenerationRequest("__base__", QUESTION), GenerationRequest("__base__", QUESTION, {"max_tokens": 3})]
    )
    assert [call["generation_config"].max_new_tokens for call in seen] == [8, 3]  # one batch per settings
    assert seen[1]["generation_config"].do_sample is False
    assert len(short.completion_ids) <= 3 and short.completion_ids == default.completion_ids[:3]
    seen.clear()
    backend.generate([GenerationRequest("__base__", QUESTION, {"temperature": 0.3, "top_p": 0.5, "top_k": 7})])
    config = seen[0]["generation_config"]
    assert (config.do_sample, config.temperature, config.top_p, config.top_k) == (True, 0.3, 0.5, 7)
    assert backend.generation_config.max_new_tokens == 8  # the shared config is untouched


def test_transformers_backend_stops_on_a_stop_string(spied):
    backend, seen = spied
    (default,) = backend.generate([GenerationRequest("__base__", QUESTION)])
    text = default.text  # the random tiny model's text: a stop string inside it, past its first characters
    windows = [text[i : i + 2] for i in range(2, len(text) - 1) if "\ufffd" not in text[i : i + 2]]
    if not windows:
        pytest.skip(f"the tiny model's greedy output {text!r} is too short to stop inside")
    stop = windows[0]
    seen.clear()
    (stopped,) = backend.generate([GenerationRequest("__base__", QUESTION, {"stop": [stop]})])
    assert seen[0]["generation_config"].stop_strings == [stop] and "tokenizer" in seen[0]
    assert stop in stopped.text and not stopped.truncated
    assert stopped.completion_ids == default.completion_ids[: len(stopped.completion_ids)]
    shorter = backend.tokenizer.decode(stopped.completion_ids[:-1], skip_special_tokens=True)
    assert stop not in shorter  # cut where the stop string is complete, no padding after it
    assert torch.tensor(stopped.completion_ids).ne(backend.tokenizer.pad_token_id).all()
