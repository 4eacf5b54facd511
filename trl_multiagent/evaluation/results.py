"""``eval_results.jsonl``: one row per evaluation, appended; a row's key says whether it was already evaluated."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

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
