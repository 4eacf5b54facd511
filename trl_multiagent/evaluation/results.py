"""``eval_results.jsonl``: one row per evaluation, appended; a row's key says whether it was already evaluated.

A row's ``problem_solved`` is, per problem in dataset order, how many of its ``k`` episodes were solved (rows
recorded before that field existed lack it: ``problem_success`` then reads the row's episode files).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..workflows.correctness import solved

RESULTS_FILE = "eval_results.jsonl"
# Two evaluations with the same values here are the same evaluation: the second one is skipped.
KEY_FIELDS = (
    "run",
    "step",
    "mode",
    "model",
    "workflow_config",
    "role_to_adapter",
    "policy_sharing",
    "dataset",
    "num_problems",
    "k",
    "temperature",
    "top_p",
    "max_completion_length",
    "seed",
    "chat_rendering",  # absent (None) for the tokenizer's template, so rows recorded before it keep their key
    "role_policies",  # absent (None) when every role runs its trained adapter
    "best_of",  # absent (None) for one sample per episode
    "select",
    "judge",  # absent (None) but for a judged best-of-n
)


def result_key(row: dict[str, Any]) -> str:
    return json.dumps({name: row.get(name) for name in KEY_FIELDS}, sort_keys=True)


def key_hash(row: dict[str, Any]) -> str:
    return hashlib.sha1(result_key(row).encode()).hexdigest()[:8]


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a results file (a folder means its ``eval_results.jsonl``); none if it does not exist."""
    path = Path(path)
    path = path / RESULTS_FILE if path.is_dir() else path
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_result(path: str | Path, row: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def problem_success(row: dict[str, Any]) -> list[float]:
    """Per problem (dataset order), the fraction of its ``k`` episodes solved: from the row's ``problem_solved``, or
    for rows recorded without it, from its episode files."""
    k = row["k"]
    if "problem_solved" in row:
        return [count / k for count in row["problem_solved"]]
    folder = Path(row["episodes_dir"])
    solved_by_problem = [[] for _ in range(row["num_problems"])]
    for path in folder.glob("problem-*.json"):
        episode = json.loads(path.read_text())
        solved_by_problem[episode["problem"]].append(solved(episode["reward"]))
    short = [p for p, outcomes in enumerate(solved_by_problem) if len(outcomes) != k]
    if short:
        raise FileNotFoundError(
            f"{folder} lacks episodes of problem(s) {short[:5]}: delete the row from eval_results.jsonl to evaluate "
            "it again."
        )
    return [sum(outcomes) / k for outcomes in solved_by_problem]
