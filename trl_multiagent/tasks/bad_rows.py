"""Malformed training rows, found before the first step: which rows and why, and what the run does with them.

The trainer checks every row of its `train_dataset` when it is built (``check_training_rows``): a prompt missing,
empty, not text or too long for any model's context; a column a reward function reads (a parameter of its own, such
as `math_reward`'s `answer`) missing or empty; and what a reward says it cannot grade (``check_row``, e.g.
`CodeReward`'s tests that do not parse). `bad_rows="stop"` (the default) refuses the run naming the rows;
`"skip"` leaves them out, names them in a warning, and logs their count with every step as `data/skipped_rows`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

POLICIES = ("stop", "skip")
# About 100k tokens at ~4 characters a token: more than the context of the models trained here (Qwen3: 40,960
# tokens), so such a prompt can only fail its step or exhaust the memory of a rollout.
MAX_PROMPT_CHARS = 400_000
SHOWN = 20  # rows named in an error or warning; the count says how many more


@dataclass(frozen=True)
class BadRow:
    index: int  # the row's position in the dataset
    reason: str


def check_bad_rows_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"bad_rows must be 'stop' or 'skip', got {policy!r}.")


def describe(bad: Sequence[BadRow], total: int) -> str:
    """One line per bad row (the first ``SHOWN``), after a count of them."""
    lines = [f"  row {row.index}: {row.reason}" for row in bad[:SHOWN]]
    if len(bad) > SHOWN:
        lines.append(f"  ... and {len(bad) - SHOWN} more")
    return f"{len(bad)} of {total} training rows are malformed:\n" + "\n".join(lines)


def _text_problem(value: Any, what: str) -> str | None:
    if not isinstance(value, str):
        return f"{what} is {type(value).__name__}, not text"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: undecodable bytes read with errors="surrogateescape"
        return f"{what} is not valid UTF-8"
    return None


def prompt_problem(prompt: Any) -> str | None:
    """Why ``prompt`` (TRL's plain text or conversational list of messages) cannot be trained on, or None."""
    if prompt is None:
        return "no 'prompt'"
    if isinstance(prompt, str):
        texts = [prompt]
        problem = _text_problem(prompt, "the prompt")
    elif isinstance(prompt, list) and prompt:
        texts, problem = [], None
        for i, message in enumerate(prompt):
            content = message.get("content") if isinstance(message, dict) else None
            problem = problem or _text_problem(content, f"message {i}'s content")
            texts.append(content if isinstance(content, str) else "")
    else:
        return f"the prompt is {type(prompt).__name__}, not text or a list of messages"
    if problem:
        return problem
    size = sum(len(text) for text in texts)
    if size == 0 or not any(text.strip() for text in texts):
        return "an empty prompt"
    if size > MAX_PROMPT_CHARS:
        return f"a prompt of {size:,} characters, over {MAX_PROMPT_CHARS:,} (about 100k tokens, past any context here)"
    return None


def columns_read_by(reward_funcs: Sequence[Callable]) -> dict[str, str]:
    """column -> the reward function that reads it: the parameters a reward names without a default (besides the
    ones TRL fills in itself)."""
    filled_by_trl = {"self", "prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    columns = {}
    for func in reward_funcs:
        if not callable(func) or isinstance(func, str):
            continue
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        name = getattr(func, "__name__", type(func).__name__)
        for parameter in parameters:
            if parameter.default is inspect.Parameter.empty and parameter.name not in filled_by_trl:
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                    columns.setdefault(parameter.name, name)
    return columns


def row_problem(row: dict[str, Any], columns: dict[str, str], row_checks: Sequence[Callable]) -> str | None:
    """Why ``row`` cannot be trained on, or None. ``columns``: column -> the reward that reads it; ``row_checks``:
    the rewards' own ``check_row``."""
    problem = prompt_problem(row.get("prompt"))
    if problem:
        return problem
    for column, reader in columns.items():
        value = row.get(column)
        if value is None or (isinstance(value, str | list) and len(value) == 0):
            return f"no {column!r} (missing, null or empty), which {reader} grades against"
        if isinstance(value, str) and (problem := _text_problem(value, repr(column))):
            return problem
    for check in row_checks:
        problem = check(row)
        if problem:
            return problem
    return None


def check_training_rows(dataset: Any, reward_funcs: Sequence[Callable], policy: str) -> tuple[Any, list[BadRow]]:
    """``dataset`` without its malformed rows, and those rows; under ``policy="stop"`` a ValueError naming them
    instead. An iterable dataset (no length) is not checked: its rows are read as training goes."""
    check_bad_rows_policy(policy)
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "select"):
        return dataset, []
    funcs = [f for f in reward_funcs or () if callable(f)]
    columns = {c: r for c, r in columns_read_by(funcs).items() if c in dataset.column_names}
    row_checks = [f.check_row for f in funcs if callable(getattr(f, "check_row", None))]
    bad = []
    for index, row in enumerate(dataset):
        problem = row_problem(row, columns, row_checks)
        if problem:
            bad.append(BadRow(index, problem))
    if not bad:
        return dataset, []
    report = describe(bad, len(dataset))
    if policy == "stop":
        fix = "Fix or drop these rows, or leave them out of training with `bad_rows='skip'` (`--bad_rows skip`)."
        raise ValueError(f"{report}\n{fix}")
    if len(bad) == len(dataset):
        raise ValueError(f"{report}\nEvery row is malformed: nothing is left to train on.")
    logger.warning("%s\nLeft out of training (bad_rows='skip').", report)
    dropped = {row.index for row in bad}
    return dataset.select([i for i in range(len(dataset)) if i not in dropped]), bad


class SkippedRowsCallback(TrainerCallback):
    """Logs `data/skipped_rows`, the rows left out of training, with every log line (and in ``log_history``)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return control
        logs["data/skipped_rows"] = float(self.count)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["data/skipped_rows"] = float(self.count)
        return control
