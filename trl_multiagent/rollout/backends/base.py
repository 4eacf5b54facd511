"""The small protocol every generation backend (transformers, vLLM, scripted test doubles) implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...workflows.base import Messages

# Sampling settings one call may override (vLLM `SamplingParams` names; the transformers backend maps `max_tokens` to
# `max_new_tokens` and `stop` to `stop_strings`). `temperature=0` is greedy decoding.
GENERATION_KWARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "stop")


@dataclass
class GenerationRequest:
    adapter: str  # adapter name to route the request to, or "__base__" for the base model
    messages: Messages
    # Overrides of the backend's sampling settings for this call (its role's `role_generation_kwargs`); keys from
    # GENERATION_KWARGS. A completion that ends on a `stop` string keeps the string and is not truncated.
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    # The episode making the call, unique within the process (the engine sets it): a backend with several servers
    # keeps an episode's calls on one server, whose prefix cache holds the conversation so far.
    session: Any = None
    # The base model the adapter sits on (`role_models`); None: the run's one base. Set by the engine when roles sit
    # on several bases, read by `PerBaseBackend`.
    base: str | None = None
    # JSON schemas of the role's tools (rollout/tool_loop.py), rendered into the prompt by the chat template; None:
    # no tools.
    tools: list[dict] | None = None
    # The prompt's token ids when the engine had the backend render them already (`max_prompt_length`), so that it
    # generates from them without rendering again; None: the backend renders `messages`.
    prompt_ids: list[int] | None = None


@dataclass(frozen=True)
class Provenance:
    """What served one call, as the backend saw it: the adapter whose weights sampled it, their version and the
    backend. Stamped from what the backend actually used (the LoRA slot a vLLM request went to and the version last
    loaded there; the live model's step for transformers), never from what the request asked for, so that a missed
    sync or a swapped slot shows."""

    adapter: str  # the adapter whose weights sampled the call ("__base__": none)
    version: int | None  # the optimizer step of those weights; None: the base model, or a backend given no clock
    backend: str  # "transformers" | "vllm-colocate" | "vllm-async" | "vllm-server"


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    completion_ids: list[int]  # up to and including the first EOS token (or the tokens of a stop string)
    text: str
    truncated: bool  # hit the completion length limit without EOS or a stop string
    sampling_logprobs: list[float] | None = None
    provenance: Provenance | None = None  # None: a backend that does not stamp (a custom or scripted one)


class GenerationBackend(Protocol):
    """``generate`` answers a batch of requests. Backends that serve copies of the adapters (vLLM) also define
    ``sync_adapters(peft_model, adapter_names=None)``, called with the trained weights before the first rollout
    after each optimizer step; one that serves every process from one place sets ``shared_across_processes``.

    A backend that batches continuously (vLLM's scheduler) also defines ``async agenerate(request) -> result``, which
    the engine's ``rollout_mode="async"`` awaits once per call, from any event loop, and ``drain()``, which returns
    once every request it was given has finished or been cancelled (the engine calls it after a failed rollout).

    ``prompt_ids(request) -> list[int]`` (the built-in backends: ``RendersPrompts``) gives the token ids a request's
    prompt would be generated from; the engine's ``max_prompt_length`` needs it."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Answer every request in one batched call, results in request order."""
        ...


def check_generation_kwargs(kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``kwargs`` as a plain dict, or a ``ValueError`` naming the unknown keys and the valid ones."""
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"{where} must be a dict of sampling settings, got {kwargs!r}.")
    unknown = sorted(set(kwargs) - set(GENERATION_KWARGS))
    if unknown:
        raise ValueError(f"{where} has unknown setting(s) {unknown}; per-call settings are {list(GENERATION_KWARGS)}.")
    stop = kwargs.get("stop")
    if stop is not None and (isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop)):
        raise ValueError(f"{where}['stop'] must be a list of non-empty strings, got {stop!r}.")
    return dict(kwargs)


def settings_key(kwargs: Mapping[str, Any]) -> tuple:
    """A hashable key of a request's settings, to batch the requests that share them."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list | tuple) else v) for k, v in kwargs.items()))


class RendersPrompts:
    """``prompt_ids(request)`` of a backend that renders prompts with its ``renderer`` (a ``ChatRenderer``): the ids
    the engine measured when the request carries them, else the rendering of its messages (and tools);
    ``prompt_ids_of(requests)`` those of a whole batch."""

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_ids is not None:
            return request.prompt_ids
        return self.renderer.prompt_ids(request.messages, request.tools)

    def prompt_ids_of(self, requests: list[GenerationRequest]) -> list[list[int]]:
        """``prompt_ids`` of every request of a batch, each distinct prompt rendered once (``ChatRenderer``)."""
        rendered = iter(self.renderer.prompt_ids_of([(r.messages, r.tools) for r in requests if r.prompt_ids is None]))
        return [r.prompt_ids if r.prompt_ids is not None else next(rendered) for r in requests]
