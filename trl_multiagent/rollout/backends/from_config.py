"""Build the rollout backend a ``MultiAgentGRPOConfig`` names, from what the trainer owns.

Backends implement ``generate(requests)``; those that serve copies of the adapters (vLLM) also implement
``sync_adapters(model, names)``, which the trainer calls before the first rollout after each optimizer step.
A backend that serves every training process from one place (a ``vllm serve`` server) sets
``shared_across_processes = True`` and is synced from the main process only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from .transformers_backend import TransformersBackend


@dataclass
class TrainerContext:
    """What a backend needs from the trainer: its model, tokenizer, routing and generation settings."""

    model: Any  # the PEFT model holding the role adapters
    adapter_names: Sequence[str]
    tokenizer: Any
    router: Any  # AdapterRouter
    unwrapped_model: Callable[[], AbstractContextManager[torch.nn.Module]]  # TRL's unwrap for generation
    generation_config: Any  # TRL's transformers GenerationConfig for rollouts
    eos_token_ids: Sequence[int]
    chat_template_kwargs: dict[str, Any] | None
    process_index: int
    num_processes: int

    @classmethod
    def of(cls, trainer) -> TrainerContext:
        """Read from a ``MultiAgentGRPOTrainer`` (duck-typed: the rollout room never imports the trainer)."""
        return cls(
            model=trainer.model,
            adapter_names=trainer.adapter_names,
            tokenizer=trainer._tokenizer,
            router=trainer.router,
            unwrapped_model=trainer._unwrapped_for_generation,
            generation_config=trainer.generation_config,
            eos_token_ids=trainer.eos_token_ids,
            chat_template_kwargs=trainer.chat_template_kwargs,
            process_index=trainer.accelerator.process_index,
            num_processes=trainer.accelerator.num_processes,
        )


def build_backend(args, context: TrainerContext):
    """The backend ``args.rollout_backend`` names: ``"transformers"``, or ``"vllm"`` (colocated or server)."""
    if args.rollout_backend == "vllm":
        return _vllm_backend(args, context)
    c = context
    return TransformersBackend(
        c.unwrapped_model, c.tokenizer, c.router, c.generation_config, c.eos_token_ids, c.chat_template_kwargs,
        max_batch_size=args.rollout_batch_size,
    )  # fmt: skip


def _vllm_backend(args, context: TrainerContext):
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
    )
    if args.vllm_mode == "server":
        urls = args.vllm_server_base_urls or [
            args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        ]
        return VLLMServerBackend(
            urls, timeout=args.vllm_server_timeout, request_timeout=args.vllm_request_timeout,
            max_concurrency=args.vllm_server_max_concurrency, **common,
        )  # fmt: skip
    lora = context.model.peft_config[context.adapter_names[0]]
    engine = dict(
        model=lora.base_model_name_or_path,
        lora_rank=max([lora.r, *lora.rank_pattern.values()]),
        dtype=str(context.model.dtype).removeprefix("torch."),  # serve the weights the trainer's log-probs use
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_len=args.vllm_max_model_length,
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


def sync_adapters(backend, peft_model, adapter_names: Sequence[str], is_main_process: bool) -> None:
    """Send the trained adapters to ``backend``: from every process to colocated engines (each holds its own copy),
    from the main process alone to one that serves them all (``shared_across_processes``)."""
    if not getattr(backend, "shared_across_processes", False) or is_main_process:
        backend.sync_adapters(peft_model, adapter_names)
