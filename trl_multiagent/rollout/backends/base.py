"""The small protocol every generation backend (transformers, vLLM, scripted test doubles) implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ...workflows.base import Messages


@dataclass
class GenerationRequest:
    adapter: str  # adapter name to route the request to, or "__base__" for the base model
    messages: Messages


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    completion_ids: list[int]  # up to and including the first EOS token
    text: str
    truncated: bool  # hit the completion length limit without EOS
    sampling_logprobs: list[float] | None = None


class GenerationBackend(Protocol):
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Answer every request in one batched call, results in request order."""
        ...
