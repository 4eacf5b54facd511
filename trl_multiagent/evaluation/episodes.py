"""One JSON file per evaluated episode: every role call with its prompt, output, parsed result and reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rollout.records import Episode, ModelCall
from ..workflows import Workflow, last_boxed, last_code_block, parse_selection, parse_strategies, parse_verdict


def parse_call(call: ModelCall, workflow: Workflow, task: str) -> dict[str, Any] | None:
    """What the workflow reads out of a call, by role type; ``None`` for roles without a built-in parser."""
    if call.role == "evaluator":
        return {"verdict": parse_verdict(call.text)}
    if call.role == "aggregator":
        index, parsed = parse_selection(call.text, getattr(workflow, "n_voters", 3))
        return {"selection": index + 1, "parsed": parsed}
    if call.role == "orchestrator":
        return {"strategies": parse_strategies(call.text, getattr(workflow, "n_workers", 3))}
    if call.role in ("generator", "worker", "synthesizer"):
        return {"answer": last_boxed(call.text)} if task == "math" else {"code": last_code_block(call.text)}
    return None


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
