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
    """``generate`` answers a batch of requests. Backends that serve copies of the adapters (vLLM) also define
    ``sync_adapters(peft_model, adapter_names=None)``, called with the trained weights before the first rollout
    after each optimizer step; one that serves every process from one place sets ``shared_across_processes``."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Answer every request in one batched call, results in request order."""
        ...
