"""The held-out evaluation split and the reward of each task, as the training recipes define them."""

from __future__ import annotations

from collections.abc import Callable

from datasets import Dataset

from ..tasks import (
    DAPO_MATH_ID,
    DEEPCODER_ID,
    CodeReward,
    load_dapo_math,
    load_deepcoder,
    make_arithmetic_dataset,
    make_toy_code_dataset,
    math_reward,
)

TASKS = ("math", "code")
DEFAULT_DATASETS = {"math": DAPO_MATH_ID, "code": DEEPCODER_ID}
# Tokens per model call in checkpoint evaluation: the reference's evaluation lengths, longer than its training lengths
# so that fewer answers are cut off; `use_training_lengths` evaluates at the training lengths (those of
# recipes/configs/paper_<task>.yaml: tests/evaluation/test_evaluation.py and tests/recipes/test_paper_preset.py compare both with the
# reference's files).
EVAL_LENGTHS = {"math": 8192, "code": 5120}
TRAINING_LENGTHS = {"math": 5120, "code": 2048}
# The offline generators have no held-out split; a seed no recipe trains with stands in for one.
GENERATED = {"math": ("arithmetic", make_arithmetic_dataset), "code": ("toy_code", make_toy_code_dataset)}
GENERATED_EVAL_SEED, GENERATED_EVAL_SIZE = 1_000_003, 200


def eval_dataset(task: str, dataset_name: str | None = None, limit: int | None = None) -> Dataset:
    """The test split of ``dataset_name`` (a Hub id, a local file, or ``arithmetic`` / ``toy_code``)."""
    check_task(task)
    name = dataset_name or DEFAULT_DATASETS[task]
    generated_name, generate = GENERATED[task]
    if name == generated_name:
        return generate(n=limit if limit is not None else GENERATED_EVAL_SIZE, seed=GENERATED_EVAL_SEED)
    load = load_dapo_math if task == "math" else load_deepcoder
    return load(split="test", path_or_id=name, limit=limit)


def task_reward(task: str) -> Callable[..., list[float]]:
    """The reward the recipes train with: ``math_reward``, or ``CodeReward()`` (all tests must pass)."""
    check_task(task)
    return math_reward if task == "math" else CodeReward()


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
    return task
