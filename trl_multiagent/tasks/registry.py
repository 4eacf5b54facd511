"""The built-in tasks by name: where their rows come from, how answers are graded, how long a model call may be.

The recipes, ``trl-multiagent``, the evaluator and the toy evaluation all look a task up here (``get_task``). The
built-in workflows' prompts and answer formats are written per task in ``workflows/`` (a workflow knows nothing of
datasets); ``tests/tasks/test_tasks_registry.py`` checks they cover exactly these tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from .arithmetic import make_arithmetic_dataset
from .code import DEEPCODER_ID, CodeReward, load_deepcoder
from .math import DAPO_MATH_ID, load_dapo_math, math_answer_checker, math_reward
from .mod_search import make_mod_search_dataset
from .toy_code import make_toy_code_dataset

# The offline generators have no held-out split: training draws GENERATED_TRAIN_SIZE rows with the run's seed,
# evaluation GENERATED_EVAL_SIZE (or `limit`) with a seed no recipe trains with.
GENERATED_TRAIN_SIZE = 1000
GENERATED_EVAL_SEED, GENERATED_EVAL_SIZE = 1_000_003, 200


@dataclass(frozen=True)
class Task:
    """One task: its dataset (and an offline generator with the same columns), its reward, its lengths."""

    name: str
    dataset_id: str  # the paper's dataset on the Hub: the default of training and evaluation
    load: Callable[..., Dataset]  # (split, path_or_id, limit) -> TRL rows: a conversational `prompt` + ground truth
    # Offline generators of rows with the same columns, graded by the same reward, by name: (n, seed) -> rows. A name
    # is accepted wherever a dataset name is; the first is the task's own (`generated`).
    generators: dict[str, Callable[..., Dataset]]
    make_reward: Callable[[], Callable[..., list[float]]]  # the reward the recipes train with (1.0: right)
    ground_truth: str  # the column the reward grades against
    training_length: int  # tokens per model call in training: recipes/configs/paper_<task>.yaml
    # Tokens per model call in evaluation: the reference's evaluation lengths, longer than its training lengths so
    # that fewer answers are cut off (tests/evaluation/test_evaluation.py and tests/recipes/test_paper_preset.py
    # compare both with the reference's files).
    eval_length: int
    answer_checker: Callable[[str, Any], bool] | None = None  # per-role regrading of one output against the truth

    @property
    def generated(self) -> str:
        """The name of the task's own offline generator: the toy dataset of its CPU presets."""
        return next(iter(self.generators))

    def generator(self, name: str | None) -> Callable[..., Dataset] | None:
        """The offline generator called ``name``, else None."""
        return self.generators.get(name) if name is not None else None

    def train_dataset(
        self, name: str | None = None, split: str = "train", seed: int = 0, bad_rows: str = "stop"
    ) -> Dataset:
        """The training rows of ``name`` (a Hub id, a local .jsonl/.parquet file, or a generator's name;
        default: the task's dataset); a generator draws ``GENERATED_TRAIN_SIZE`` rows with ``seed``. ``bad_rows``:
        what a row that cannot be read does, "stop" or "skip" (the run's `bad_rows`)."""
        generate = self.generator(name)
        if generate is not None:
            return generate(n=GENERATED_TRAIN_SIZE, seed=seed)
        return self.load(split=split, path_or_id=name or self.dataset_id, bad_rows=bad_rows)

    def eval_dataset(self, name: str | None = None, limit: int | None = None) -> Dataset:
        """The test split of ``name`` (as in ``train_dataset``), its first ``limit`` problems."""
        generate = self.generator(name)
        if generate is not None:
            return generate(n=limit if limit is not None else GENERATED_EVAL_SIZE, seed=GENERATED_EVAL_SEED)
        return self.load(split="test", path_or_id=name or self.dataset_id, limit=limit)


TASKS: dict[str, Task] = {
    "math": Task(
        name="math",
        dataset_id=DAPO_MATH_ID,
        load=load_dapo_math,
        # mod_search.py: easy to check, hard to answer in one pass, where verification and retries should pay.
        generators={"arithmetic": make_arithmetic_dataset, "mod_search": make_mod_search_dataset},
        make_reward=lambda: math_reward,
        ground_truth="answer",
        training_length=5120,
        eval_length=8192,
        answer_checker=math_answer_checker,
    ),
    "code": Task(
        name="code",
        dataset_id=DEEPCODER_ID,
        load=load_deepcoder,
        generators={"toy_code": make_toy_code_dataset},
        make_reward=CodeReward,  # every test must pass
        ground_truth="tests",
        training_length=2048,
        eval_length=5120,
    ),
}


def get_task(name: str) -> Task:
    """The task called ``name``; a ``ValueError`` naming the built-in tasks otherwise."""
    if name not in TASKS:
        raise ValueError(f"Unknown task {name!r}; the built-in tasks are {', '.join(map(repr, TASKS))}.")
    return TASKS[name]
