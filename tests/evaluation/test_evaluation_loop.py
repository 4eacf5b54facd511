"""Evaluation inside training (TRL's `eval_dataset` / `eval_strategy` / `evaluate()`): episodes run with
`num_generations_eval` and every `eval_` metric is logged per role and per workflow."""

from __future__ import annotations

import math
import re

from datasets import IterableDataset
from scripted import addition_dataset
from tiny import tiny_trainer

from trl_multiagent import EvalOpt


def judge_or_answer(requests, rng):
    """The generator answers "What is i + 2?" right for even i, wrong for odd i; the evaluator (isolated policy:
    adapter "evaluator") gives random verdicts."""
    outputs = []
    for request in requests:
        if request.adapter == "evaluator":
            outputs.append(rng.choice(["\\boxed{Correct}", "\\boxed{Incorrect}"]))
            continue
        i = int(re.search(r"What is (\d+) \+ 2", request.messages[0]["content"]).group(1))
        outputs.append(f"\\boxed{{{i + 2 if i % 2 == 0 else i + 3}}}")
    return outputs


def eval_trainer(model_dir, tmp_path, **overrides):
    settings = dict(
        per_device_eval_batch_size=4,
        num_generations_eval=2,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        save_strategy="no",
        seed=0,
        policy_sharing="isolated",
    )
    return tiny_trainer(
        model_dir,
        tmp_path / "out",
        EvalOpt(max_iterations=2),
        dataset=addition_dataset(4),
        eval_dataset=addition_dataset(6),
        respond=judge_or_answer,
        **{**settings, **overrides},
    )


def test_training_with_eval_strategy_steps_logs_eval_metrics_per_role(tiny_model_dir, tmp_path):
    trainer = eval_trainer(tiny_model_dir, tmp_path, eval_strategy="steps", eval_steps=1, num_generations_eval=2)
    eval_prompts = []
    run = trainer.engine.run

    def recording_run(prompts):
        if not trainer.model.training:
            eval_prompts.extend(prompts)
        return run(prompts)

    trainer.engine.run = recording_run
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evals) == 2  # one evaluation after each of the two steps
    assert len(eval_prompts) == 2 * 6 * 2  # every eval row, num_generations_eval episodes each, at each evaluation
    for logs in evals:
        assert math.isfinite(logs["eval_loss"])
        assert logs["eval_workflow/success"] == 0.5  # rows 0, 2, 4 of 0..5 are answered right
        for key in EVAL_KEYS:
            assert key in logs, key
    assert not any(key.startswith("eval_") for h in trainer.state.log_history if "loss" in h for key in h)


EVAL_KEYS = [
    "eval_reward",
    "eval_rewards/boxed_answer_reward/mean",
    "eval_workflow/calls_per_episode",
    "eval_workflow/verdict_correct_rate",
    "eval_workflow/iterations",
    *(
        f"eval_role/{role}/{metric}"
        for role in ("generator", "evaluator")
        for metric in ("calls", "completion_length", "entropy", "perplexity", "policy_ratio", "unparseable")
    ),
]


def test_evaluate_runs_episodes_on_the_eval_dataset_without_training(tiny_model_dir, tmp_path):
    trainer = eval_trainer(tiny_model_dir, tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    metrics = trainer.evaluate()
    logs = trainer.state.log_history[-1]  # what TRL logs next to the returned metrics
    assert math.isfinite(metrics["eval_loss"]) and logs["eval_loss"] == metrics["eval_loss"]
    assert logs["eval_workflow/success"] == 0.5
    assert logs["eval_role/generator/calls"] >= 4  # per eval batch: 2 prompts x 2 episodes, one attempt or more
    assert all(key in logs for key in EVAL_KEYS)
    assert all(p.equal(before[n]) for n, p in trainer.model.named_parameters() if "lora_" in n)


def test_every_evaluation_form_trl_supports(tiny_model_dir, tmp_path):
    """`eval_on_start`, a dict of eval datasets (each logged under its own prefix) and an iterable eval dataset."""
    rows = addition_dataset(4)
    trainer = eval_trainer(
        tiny_model_dir,
        tmp_path,
        eval_strategy="steps",
        eval_steps=1,
        eval_on_start=True,
        max_steps=1,
    )
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [0, 1]  # before the first step, then after it

    trainer.evaluate(eval_dataset={"easy": rows, "hard": addition_dataset(6)})
    logged = {key for h in trainer.state.log_history for key in h}
    assert {"eval_easy_loss", "eval_hard_loss"} <= logged

    iterable = IterableDataset.from_generator(lambda: iter(rows))
    trainer.evaluate(eval_dataset=iterable)
    assert "eval_workflow/success" in trainer.state.log_history[-1]
