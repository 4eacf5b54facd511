"""Rollouts when roles sit on several base models (``Bases``): one backend per base, one batch per base.

Each request carries the base its role sits on (``GenerationRequest.base``, set by the engine); the requests of a
tick are grouped by base and each group goes to that base's own backend (a ``TransformersBackend`` over that base's
PEFT model, tokenizer and router, or a vLLM engine of that base) as one batch, results back in request order. When
every base's backend batches continuously (``agenerate``: vLLM under ``rollout_mode="async"``), so does this one, each
call going to its base's engine as it is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import GenerationBackend, GenerationRequest, GenerationResult


class PerBaseBackend:
    """Sends each request to the backend of its base (``backends``: base name -> backend)."""

    def __init__(self, backends: Mapping[str, GenerationBackend]):
        self.backends = dict(backends)
        # one server for every training process: synced from the main process only
        self.shared_across_processes = all(getattr(b, "shared_across_processes", False) for b in backends.values())
        if all(hasattr(b, "agenerate") for b in self.backends.values()):  # the engine's async mode asks for these
            self.agenerate, self.drain = self._agenerate, self._drain

    def _backend_of(self, request: GenerationRequest) -> GenerationBackend:
        if request.base not in self.backends:
            raise KeyError(
                f"A request for adapter {request.adapter!r} names base model {request.base!r}; the bases served "
                f"are {sorted(map(str, self.backends))}."
            )
        return self.backends[request.base]

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        return self._backend_of(request).prompt_ids(request)

    async def _agenerate(self, request: GenerationRequest) -> GenerationResult:
        return await self._backend_of(request).agenerate(request)

    def _drain(self) -> None:
        for backend in self.backends.values():
            backend.drain()

    def close(self) -> None:
        for backend in self.backends.values():
            if hasattr(backend, "close"):
                backend.close()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            self._backend_of(request)
            groups.setdefault(request.base, []).append(i)
        results: list[GenerationResult | None] = [None] * len(requests)
        for base, rows in groups.items():
            answers = self.backends[base].generate([requests[i] for i in rows])
            if len(answers) != len(rows):
                raise RuntimeError(
                    f"The backend of {base!r} returned {len(answers)} results for {len(rows)} requests."
                )
            for i, answer in zip(rows, answers):
                results[i] = answer
        return results

    def sync_adapters(self, bases: Mapping[str, tuple[Any, Sequence[str]]], is_main_process: bool) -> None:
        """Send every base's trained adapters (``bases``: base name -> (its PEFT model, its adapters)) to the
        backends that serve copies of them (vLLM), or follow the main process's sync of a server (``follow_sync``);
        transformers backends generate from the trained weights."""
        for base, backend in self.backends.items():
            model, adapter_names = bases[base]
            if hasattr(backend, "sync_adapters") and (
                not getattr(backend, "shared_across_processes", False) or is_main_process
            ):
                backend.sync_adapters(model, adapter_names)
            elif hasattr(backend, "follow_sync"):  # a server synced by the main process: take the names it used
                backend.follow_sync(adapter_names)
