"""Checks before training: the dataset has prompts, and a walk through the workflow with empty outputs (an
undeclared role fails now, and the parallel roles show)."""

from __future__ import annotations

from collections.abc import Mapping

from ..workflows.base import Messages, Workflow
from .backends.base import GenerationRequest, GenerationResult
from .engine import RolloutEngine
from .records import Episode


class _EmptyBackend:
    """Answers every call with an empty output."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult(prompt_ids=[], completion_ids=[], text="", truncated=False) for _ in requests]


def probe_episode(workflow: Workflow, role_adapters: Mapping[str, str], prompt: Messages) -> Episode:
    """One episode of ``workflow`` on ``prompt`` where every model call returns empty text."""
    # Empty outputs call no tools: the roles run without them.
    return RolloutEngine(workflow, _EmptyBackend(), role_adapters, role_tools={}).run([prompt])[0]


def probe_first_row(workflow: Workflow, role_adapters: Mapping[str, str], dataset) -> Episode | None:
    """`probe_episode` on the first row's prompt (an iterable dataset too); None without rows."""
    first = next(iter(dataset), None) if dataset is not None else None
    return probe_episode(workflow, role_adapters, first["prompt"]) if first is not None else None


def check_prompt_column(dataset, name: str) -> None:
    if dataset is None:
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"`{name}` has no `prompt` column (columns: {columns}). Each row needs a conversational `prompt` (a list "
            'of messages such as [{"role": "user", "content": "..."}]) or a plain-text one (TRL\'s standard format).'
        )
