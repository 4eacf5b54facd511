"""Build the rollout backend a ``MultiAgentGRPOConfig`` names, from a ``BackendContext`` (what the trainer owns).

Backends implement ``generate(requests)``; those that serve copies of the adapters (vLLM) also implement
``sync_adapters(model, names)``, which the trainer calls before the first rollout after each optimizer step.
A backend that serves every training process from one place (a ``vllm serve`` server) sets
``shared_across_processes = True`` and is synced from the main process only.
"""

from __future__ import annotations

import collections
import copy
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ...adapters.bases import same_model
from .per_base import PerBaseBackend
from .transformers_backend import TransformersBackend


@dataclass(frozen=True)
class BackendContext:
    """What a backend is built from: the model, tokenizer, routing and generation settings of one base model (the
    trainer builds it from what it owns; the rollout package never sees the trainer)."""

    model: Any  # the PEFT model holding the role adapters
    adapter_names: Sequence[str]
    tokenizer: Any
    router: Any  # AdapterRouter
    unwrapped_model: Callable[[], AbstractContextManager[torch.nn.Module]]  # TRL's unwrap for generation
    generation_config: Any  # TRL's transformers GenerationConfig for rollouts
    eos_token_ids: Sequence[int]
    chat_template_kwargs: dict[str, Any] | None
    chat_rendering: str  # "tokenizer" | "reference_qwen" (rollout.chat_rendering)
    process_index: int
    num_processes: int
    base: str | None = None  # the name of this base model when roles sit on several
    weights_step: Callable[[], int] | None = None  # the optimizer step of the trained weights now (provenance stamps)
    # What to do once a failed rollout server is back: where the run resumes from, and the command (the trainer's)
    next_steps: Callable[[], str] | None = None
    extra: dict[str, BackendContext] = field(default_factory=dict)  # the same for every other base, by name

    def on_bases(self, bases, routers: Mapping[str | None, Any]) -> BackendContext:
        """This context (of the trainer's base) with one per other base of ``bases`` (an ``adapters.bases.Bases``) in
        ``extra``; ``routers``: base name -> its router. Unchanged when the run has one unnamed base."""
        if bases.main is None:
            return self
        extra = {name: self.for_base(base, routers[name]) for name, base in bases.extra.items()}
        return replace(self, adapter_names=bases.adapters_of(bases.main), base=bases.main, extra=extra)

    def for_base(self, base, router) -> BackendContext:
        """This context for another base (a ``RoleBase``): its model, adapters, tokenizer, router and end tokens."""
        eos = base_eos_token_ids(base.model, base.tokenizer)
        config = copy.deepcopy(self.generation_config)
        config.update(
            pad_token_id=base.tokenizer.pad_token_id, bos_token_id=base.tokenizer.bos_token_id, eos_token_id=eos
        )
        return replace(
            self,
            model=base.model,
            adapter_names=list(base.adapters),
            tokenizer=base.tokenizer,
            router=router,
            unwrapped_model=lambda: nullcontext(base.model),
            generation_config=config,
            eos_token_ids=eos,
            base=base.name,
            extra={},
        )


def base_eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion of ``model``: its declared EOS ids and the tokenizer's, as TRL collects them."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]


def build_backend(args, context: BackendContext):
    """The backend ``args.rollout_backend`` names: ``"transformers"``, or ``"vllm"`` (colocated or server); with
    roles on several base models, one such backend per base behind a ``PerBaseBackend``."""
    if context.extra:
        contexts = {context.base: replace(context, extra={}), **context.extra}
        if args.rollout_backend == "vllm" and args.vllm_mode == "server":
            per_base = args.vllm_server_base_urls
            if not isinstance(per_base, dict):
                raise ValueError(
                    "A vLLM server serves one base model; with roles on several base models (`role_models`) give "
                    "each base its own servers: vllm_server_base_urls={"
                    + ", ".join(f"{base!r}: ['http://host:{8000 + i}']" for i, base in enumerate(contexts))
                    + "} (`trl-multiagent vllm-serve` prints one command per base), or use vllm_mode='colocate'."
                )
            unknown = [key for key in per_base if not any(same_model(key, base) for base in contexts)]
            if unknown:
                raise ValueError(
                    f"`vllm_server_base_urls` names {unknown}, which no role sits on; the bases are {list(contexts)}."
                )
        share = 1.0 / len(contexts)  # colocated vLLM engines split the GPU memory evenly
        return PerBaseBackend({name: _backend(args, c, share) for name, c in contexts.items()})
    return _backend(args, context, 1.0)


def _backend(args, context: BackendContext, memory_share: float):
    if args.rollout_backend == "vllm":
        return _vllm_backend(args, context, memory_share)
    c = context
    return TransformersBackend(
        c.unwrapped_model,
        c.tokenizer,
        c.router,
        c.generation_config,
        c.eos_token_ids,
        c.chat_template_kwargs,
        max_batch_size=args.rollout_batch_size,
        max_batch_tokens=args.rollout_max_batch_tokens,
        chat_rendering=c.chat_rendering,
        weights_step=c.weights_step,
        continuous_batching=continuous_batching_config(args),
        report_logprobs=args.old_logprobs == "rollout",  # the log-probs before the update (config/old_logprobs.py)
    )


def continuous_batching_config(args):
    """TRL's ``use_transformers_continuous_batching``: the ``ContinuousBatchingConfig`` of its
    ``transformers_continuous_batching_config``, ``max_memory_percent`` 0.5 unless set (TRL 1.16's default, which
    leaves memory for the backward pass); None when off."""
    if not args.use_transformers_continuous_batching:
        return None
    from transformers import ContinuousBatchingConfig  # transformers >= 5.8, which TRL checks first

    settings = dict(args.transformers_continuous_batching_config or {})
    settings.setdefault("max_memory_percent", 0.5)
    return ContinuousBatchingConfig(**settings)


def _vllm_backend(args, context: BackendContext, memory_share: float = 1.0):
    from .vllm_backend import AsyncVLLMBackend, VLLMBackend
    from .vllm_server import VLLMServerBackend

    sampling = dict(
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p or 0.0,
        repetition_penalty=args.repetition_penalty,
        **(args.generation_kwargs or {}),
    )
    common = dict(
        tokenizer=context.tokenizer,
        adapter_names=list(context.adapter_names),
        sampling=sampling,
        eos_token_ids=context.eos_token_ids,
        chat_template_kwargs=context.chat_template_kwargs,
        chat_rendering=context.chat_rendering,
        weights_step=context.weights_step,
    )
    if args.vllm_mode == "server":
        urls = server_urls(args, context.base)
        return VLLMServerBackend(
            urls,
            timeout=args.vllm_server_timeout,
            request_timeout=args.vllm_request_timeout,
            max_concurrency=args.vllm_server_max_concurrency,
            run=run_tag(context.num_processes),
            failover=args.vllm_server_failover,
            next_steps=context.next_steps,
            **common,
        )
    lora = context.model.peft_config[context.adapter_names[0]]
    engine = dict(
        model=lora.base_model_name_or_path,
        lora_rank=max([lora.r, *lora.rank_pattern.values()]),
        dtype=str(context.model.dtype).removeprefix("torch."),  # serve the weights the trainer's log-probs use
        gpu_memory_utilization=args.vllm_gpu_memory_utilization * memory_share,
        max_model_len=args.vllm_max_model_length,
        model_impl=args.vllm_model_impl,
        trust_remote_code=args.trust_remote_code,
        max_num_seqs=args.rollout_batch_size,
        seed=args.seed + context.process_index,  # processes sample different episodes
    )
    if args.rollout_mode == "async":
        if context.num_processes > 1:
            raise ValueError(
                "rollout_mode='async' with a colocated vLLM runs vLLM's AsyncLLM in a child process, which can't join "
                "the training processes' device group. With several training processes, serve the base model with "
                "`vllm serve` (one per node) and set vllm_mode='server' with vllm_server_base_urls, or use "
                "rollout_mode='ticks'."
            )
        return AsyncVLLMBackend(**engine, **common)
    executor = "external_launcher" if context.num_processes > 1 else "uni"
    return VLLMBackend(**engine, distributed_executor_backend=executor, **common)


def server_urls(args, base: str | None) -> list[str]:
    """The `vllm serve` URLs of ``base`` (None: the run's one base): its entry of a per-base
    ``vllm_server_base_urls``, else the run's URL list or single URL."""
    urls = args.vllm_server_base_urls
    if isinstance(urls, dict):
        found = [servers for key, servers in urls.items() if base is not None and same_model(key, base)]
        if base is None and len(urls) == 1:
            found = list(urls.values())
        if not found:
            raise ValueError(
                f"`vllm_server_base_urls` gives no servers for base model {base!r} (it lists {sorted(urls)}); add "
                f"{base!r}: ['http://host:port'] for the `vllm serve` of that base."
            )
        return found[0]
    return urls or [args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"]


def run_tag(num_processes: int) -> str:
    """A new tag for this trainer's adapter names on its servers (``served_adapters.py``), drawn by the main process
    and the same in every process."""
    tag = [uuid.uuid4().hex[:8]]
    if num_processes > 1:
        torch.distributed.broadcast_object_list(tag, src=0)  # the training processes' group (gloo or NCCL)
    return tag[0]


def sync_adapters(backend, bases: Mapping[Any, tuple[Any, Sequence[str]]], is_main_process: bool) -> None:
    """Send the trained adapters to ``backend`` (``bases``: base name -> (its PEFT model, its adapters), the trainer's
    own first): from every process to colocated engines (each holds its own copy), from the main process alone to
    one that serves them all (``shared_across_processes``), which the other processes follow (``follow_sync``: the
    names it loaded them under); a ``PerBaseBackend`` sends each base's to its engine."""
    if isinstance(backend, PerBaseBackend):
        return backend.sync_adapters(bases, is_main_process)
    model, adapter_names = next(iter(bases.values()))
    if not getattr(backend, "shared_across_processes", False) or is_main_process:
        backend.sync_adapters(model, adapter_names)
    elif hasattr(backend, "follow_sync"):
        backend.follow_sync(adapter_names)


def backend_metrics(backend) -> dict[str, float]:
    """What the backend reports about its last rollouts (a server backend: servers out of rotation, calls failed
    over), summed over the backends of a ``PerBaseBackend``; empty for a backend that reports nothing."""
    backends = backend.backends.values() if isinstance(backend, PerBaseBackend) else [backend]
    totals: collections.Counter = collections.Counter()
    for each in backends:
        if hasattr(each, "rollout_metrics"):
            totals.update(each.rollout_metrics())
    return dict(totals)
