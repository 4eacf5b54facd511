"""0.1.0's ``trl_multiagent.evaluation.eval_dataset`` and ``task_reward``, over the task registry that replaced them.

Reached only through their deprecated names (``deprecation.MOVED``); use ``trl_multiagent.tasks.get_task``.
"""

from __future__ import annotations

from collections.abc import Callable

from datasets import Dataset

from ..tasks import get_task


def eval_dataset(task: str, dataset_name: str | None = None, limit: int | None = None) -> Dataset:
    """The test split of ``dataset_name`` (a Hub id, a local file, or an offline generator's name) of ``task``."""
    return get_task(task).eval_dataset(dataset_name, limit)


def task_reward(task: str) -> Callable[..., list[float]]:
    """The reward the recipes train ``task`` with."""
    return get_task(task).make_reward()
