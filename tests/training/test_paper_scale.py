"""The paper preset at scale: a token budget per rollout `generate` call (same greedy outputs, every call within it)
and a training step sized over all processes (the same episodes and optimizer steps on 1 and 2 processes)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys

import pytest
from harness import TESTS, run_offline
from presets import preset
from workers.step_size_worker import one_step

from trl_multiagent import MultiAgentGRPOConfig, Voting
from trl_multiagent.checkpoints import load_base_workflow
from trl_multiagent.evaluation import eos_token_ids, make_generation_config
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend, token_bounded_batches

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def recorded(tiny_model_dir):
    """A greedy transformers backend on the tiny model; its model's `generate` records each call's input shape."""
    trained = load_base_workflow(tiny_model_dir, Voting())
    shapes = []
    original = trained.model.generate

    def generate(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    trained.model.generate = generate

    def backend(budget):
        config = make_generation_config(trained, max_new_tokens=NEW_TOKENS)
        model = contextlib.nullcontext(trained.model)
        return TransformersBackend(
            lambda: model, trained.tokenizer, trained.router, config, eos_token_ids(trained), max_batch_tokens=budget
        )

    return backend, shapes


def requests_of_many_lengths() -> list[GenerationRequest]:
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    return [
        GenerationRequest("__base__", [{"role": "user", "content": " ".join(words[: 1 + (7 * i) % len(words)])}])
        for i in range(12)
    ]


def test_token_budget_bounds_every_generate_and_keeps_greedy_outputs(recorded):
    backend, shapes = recorded
    requests = requests_of_many_lengths()
    shapes.clear()
    whole = backend(None).generate(requests)
    assert len(shapes) == 1  # no budget: the whole tick in one call
    widest = shapes[0][1]
    budget = 3 * (widest + NEW_TOKENS)
    shapes.clear()
    bounded = backend(budget).generate(requests)
    assert len(shapes) >= 4 and all(rows * (width + NEW_TOKENS) <= budget for rows, width in shapes)
    assert sum(rows for rows, _ in shapes) == len(requests)
    # the same samples, in the requests' order (each call's prompt is the request's own)
    assert [r.prompt_ids for r in bounded] == [backend(None).tokenize(q.messages) for q in requests]
    assert [r.completion_ids for r in bounded] == [r.completion_ids for r in whole]
    assert any(len(r.completion_ids) > 1 for r in whole)
    shapes.clear()
    backend(len(requests) * (widest + NEW_TOKENS)).generate(requests)
    assert shapes == [(len(requests), widest)]  # within the budget: one call, as without one


def test_call_longer_than_the_budget_runs_alone_with_a_warning(recorded, caplog):
    backend, shapes = recorded
    requests = requests_of_many_lengths()
    whole = backend(None).generate(requests)
    lengths = [len(r.prompt_ids) for r in whole]
    budget = max(lengths) + NEW_TOKENS - 1  # only the longest prompt(s) do not fit alone
    shapes.clear()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.rollout.backends.transformers_backend"):
        bounded = backend(budget).generate(requests)
    longest = lengths.count(max(lengths))
    assert f"{longest} call(s) need more than rollout_max_batch_tokens={budget}" in caplog.text
    assert shapes.count((1, max(lengths))) == longest
    assert [r.completion_ids for r in bounded] == [r.completion_ids for r in whole]


def test_token_bounded_batches_pack_shortest_first():
    # rows x (longest prompt + 2 new tokens) <= 12; prompt 11 exceeds it alone and is its own call
    assert token_bounded_batches([4, 1, 11, 2, 1], 2, 1, max_rows=8, max_tokens=12) == [[1, 4, 3], [0], [2]]
    assert token_bounded_batches([1, 1, 1, 1], 2, 1, max_rows=3, max_tokens=100) == [[0, 1, 2], [3]]
    assert token_bounded_batches([1, 1, 1, 1], 2, 2, max_rows=8, max_tokens=12) == [[0, 1], [2, 3]]  # 2 beams a row


def config(tmp_path, **fields) -> MultiAgentGRPOConfig:
    return MultiAgentGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **fields)


def test_prompts_per_step_sizes_the_step_over_all_processes(tmp_path, monkeypatch):
    paper = {
        k: preset("paper_math")[k] for k in ("prompts_per_step", "gradient_accumulation_steps", "num_generations")
    }
    args = config(tmp_path, **paper)
    assert (args.per_device_train_batch_size, args.steps_per_generation, args.generation_batch_size) == (64, 8, 512)
    assert config(tmp_path, **paper, per_device_train_batch_size=64).generation_batch_size == 512
    for processes, per_process in ((2, 32), (8, 8)):
        monkeypatch.setattr(MultiAgentGRPOConfig, "world_size", property(lambda self, n=processes: n))
        args = config(tmp_path, **paper)
        assert (args.per_device_train_batch_size, args.generation_batch_size) == (per_process, 512)
    monkeypatch.setattr(MultiAgentGRPOConfig, "world_size", property(lambda self: 3))
    with pytest.raises(ValueError, match=r"Run on one of \[1, 2, 4, 8, 16, 32, 64\] processes"):
        config(tmp_path, **paper)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(prompts_per_step=3, num_generations=2, gradient_accumulation_steps=4), "do not split into"),
        (dict(prompts_per_step=4, num_generations=2, per_device_train_batch_size=2), "conflicts with"),
        (dict(prompts_per_step=4, num_generations=2, generation_batch_size=16), "leave both unset"),
        (dict(prompts_per_step=0), "must be >= 1"),
        (dict(rollout_max_batch_tokens=256, max_completion_length=256), "must exceed max_completion_length"),
    ],
)
def test_bad_step_and_rollout_sizes_fail_early(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **fields)


@pytest.mark.slow  # ~50 s with torchrun's start-up on a shared 2-core machine (training/test_ddp.py: 57 s beside it)
def test_a_paper_step_is_the_same_on_one_and_two_processes(tiny_model_dir, tmp_path):
    """The paper preset's batch fields scaled down (4 prompts per step, mini-batches of 2 prompts, 2 episodes per
    prompt, 2 micro-steps): one step trains the same episodes and each adapter takes the same optimizer steps."""
    one = one_step(tiny_model_dir, str(tmp_path / "1"), rank=0)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29529",
        str(TESTS / "workers" / "step_size_worker.py"),
        tiny_model_dir,
        str(tmp_path),
    ]
    run_offline(command)
    two = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert one["per_device_train_batch_size"] == 4 and [r["per_device_train_batch_size"] for r in two] == [2, 2]
    assert one["episodes"] == 8 and sum(r["episodes"] for r in two) == 8  # 4 prompts x 2 episodes, in total
    # Voting, isolated: the generator makes 3 calls an episode (24 samples, 6 mini-batches of 4), the aggregator 1 (2)
    assert one["optimizer_steps"] == {"generator": 6.0, "aggregator": 2.0}
    assert all(r["optimizer_steps"] == one["optimizer_steps"] for r in two)
    assert one["samples_trained"] == two[0]["samples_trained"] == 32.0


DEEPSPEED_BATCH = """
from trl_multiagent import MultiAgentGRPOConfig
MultiAgentGRPOConfig.world_size = property(lambda self: 2)
auto = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto"}
args = MultiAgentGRPOConfig(output_dir="out", use_cpu=True, bf16=False, deepspeed=auto, prompts_per_step=4,
                            num_generations=2, gradient_accumulation_steps=2)
config = args.hf_deepspeed_config.config
print(args.per_device_train_batch_size, config["train_micro_batch_size_per_gpu"], config["train_batch_size"])
"""


@pytest.mark.slow
def test_deepspeed_batch_sizes_follow_prompts_per_step(tmp_path):
    """TrainingArguments fills DeepSpeed's "auto" sizes before the per-process batch is divided: they are filled
    again from the divided one (in a fresh process: a DeepSpeed config sets up the process's distributed state)."""
    result = run_offline(
        [sys.executable, "-c", DEEPSPEED_BATCH], cwd=tmp_path, env={"DS_ACCELERATOR": "cpu"}, timeout=300
    )
    assert result.stdout.split()[-3:] == ["2", "2", "8"]  # 4 prompts x 2 episodes = 2 processes x 2 micro-steps x 2
