"""One JSON file per evaluated episode: every role call with its prompt, output, parsed result and reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rollout.records import Episode, ModelCall
from ..workflows import Workflow


def parse_call(call: ModelCall, workflow: Workflow, task: str) -> dict[str, Any] | None:
    """What the workflow reads out of a call, through the role's declared format (``workflow.formats``): its kind, the
    value the workflow acts on (a selection 1-based, as the aggregator writes it) and whether the primary rule read
    it; ``None`` for a role without a declared format."""
    fmt = workflow.formats.get(call.role)
    if fmt is None:
        return None
    value = fmt.read(call.text)
    return {
        "kind": fmt.kind,
        "value": value + 1 if fmt.kind == "selection" else value,
        "parsed": fmt.parse(call.text) is not None,
    }


def episode_record(
    episode: Episode, row: dict[str, Any], sample: int, reward: float, workflow: Workflow, task: str
) -> dict[str, Any]:
    """The episode as JSON: the dataset row, the final answer, its reward (broadcast to every call, as in training)."""
    return {
        "sample": sample,
        "reward": reward,
        "final_answer": episode.final_answer,
        "row": row,
        "calls": [
            {
                "role": call.role,
                "instance": call.instance,
                "adapter": call.adapter,
                "messages": call.messages,
                "output": call.text,
                "parsed": parse_call(call, workflow, task),
                "completion_tokens": len(call.completion_ids),
                "truncated": call.truncated,
                "reward": reward,
            }
            for call in episode.calls
        ],
    }


def write_episode(folder: Path, problem: int, record: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"problem-{problem:05d}-sample-{record['sample']:02d}.json"
    path.write_text(json.dumps({"problem": problem, **record}, indent=1, ensure_ascii=False, default=str))
