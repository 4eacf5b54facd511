"""The training forwards of a step: which samples go in each forward, as many forwards on every process, and the
log-probs before an update, every sample through its adapter.

The trainer's step hands these functions what they need (`Forwards`: the bounds, the layout, the loss type, the
padding token, the processes' alignment; trainer/step_forwards.py); each forward's rows are then laid out without a
mask for the trainer's log-prob hook (row_layout.py). Every cut keeps the update what one pass over the samples
would give: the weights are corrected by each forward's share (mini_batches.split_for_memory), stand-in rows and
forwards train nothing (even_forwards.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from ..seams.transformers import checkpointing_on
from .batch import TrainingBatch
from .even_forwards import MostOverProcesses, even_forwards
from .mini_batches import bounded_logps, padded_tokens, split_for_memory
from .recompute import fit_of, recompute_off, recomputes

Forward = Callable[[TrainingBatch, list[str]], torch.Tensor]  # (samples, their adapters) -> [n, C] log-probs


@dataclass(frozen=True, kw_only=True)
class Forwards:
    """What bounds and lays out the forwards of a run, as the trainer is now."""

    max_samples: int  # per forward (`per_device_train_batch_size`, or the evaluation's)
    max_tokens: int | None  # per forward (`max_tokens_per_micro_batch`)
    layout: str  # row_layout.LAYOUTS: one sample a row, or packed
    loss_type: str
    pad_token_id: int
    alignment: object  # adapters/process_alignment.py's `ProcessAlignment`
    most_over_processes: MostOverProcesses | None  # None with one process
    fit: int | None = None  # the most tokens a forward with backward holds without recompute (`activation_memory_gb`)

    @classmethod
    def for_run(cls, args, *, mode: str, backward: bool, model, **fields) -> Forwards:
        """The forwards of a run in ``mode`` ("train" or "eval"), bounded by its settings (``args``): at most
        `per_device_*_batch_size` samples and `max_tokens_per_micro_batch` tokens, and those with a ``backward`` the
        tokens whose activations fit `activation_memory_gb` on ``model``, where set; ``fields``: the others (layout,
        loss type, padding token, alignment, most over processes)."""
        size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        max_tokens, fit = args.max_tokens_per_micro_batch, None
        if backward:
            fit = fit_of(model, args.activation_memory_gb, low_precision=args.bf16 or args.fp16)
        if fit is not None:
            max_tokens = fit if max_tokens is None else min(max_tokens, fit)
        return cls(max_samples=size, max_tokens=max_tokens, fit=fit, **fields)

    @property
    def packed(self) -> bool:
        return self.layout == "packed"

    def loss_forwards(self, batch: TrainingBatch, keys: Sequence[str] | None) -> list[TrainingBatch]:
        """One micro-step's samples (loss-ready) in bounded forwards of one key each (adapter, or base model under
        DeepSpeed), alike on every process; their losses add up to the micro-step's."""
        parts = split_for_memory(
            batch,
            max_samples=self.max_samples,
            max_tokens=self.max_tokens,
            loss_type=self.loss_type,
            keys=keys,
            packed=self.packed,
        )
        parts = self.alignment.same_forwards(parts, self.pad_token_id)  # under DeepSpeed
        return self.even(self.alignment.synchronised_last(parts, self.pad_token_id))

    def recompute(self, part: TrainingBatch, *, models: Sequence, gradient_checkpointing_kwargs: dict | None):
        """Around a loss forward of ``part``: gradient checkpointing off on ``models`` (the bases) where its
        activations fit (training/recompute.py); as set (TRL's) without a ``fit``."""
        if self.fit is None:
            return nullcontext()
        on = checkpointing_on(models[0])
        if recomputes(padded_tokens(part, packed=self.packed), fit=self.fit, gradient_checkpointing=on):
            return nullcontext()
        return recompute_off(models, gradient_checkpointing_kwargs)

    def evaluation_forwards(self, batch: TrainingBatch, keys: Sequence[str] | None) -> list[TrainingBatch]:
        """An evaluation batch's loss forwards: one unless adapters (DeepSpeed) or bases must not mix in one, each
        weighted so that their losses add up to the batch's, alike on every process as training's are."""
        parts = split_for_memory(batch, max_samples=len(batch), max_tokens=None, loss_type=self.loss_type, keys=keys)
        return self.even(self.alignment.same_forwards(parts, self.pad_token_id))

    def even(self, parts: list[TrainingBatch]) -> list[TrainingBatch]:
        """With several processes, as many loss forwards of as many rows on each (training/even_forwards.py)."""
        if self.most_over_processes is None:
            return parts
        return even_forwards(
            parts,
            most_over_processes=self.most_over_processes,
            pad_token_id=self.pad_token_id,
            loss_type=self.loss_type,
        )

    def routed_logps(
        self, batch: TrainingBatch, adapters: list[str], *, keys: Sequence[str] | None, forward: Forward
    ) -> torch.Tensor:
        """`[N, C]` log-probs of every sample through ``adapters`` (one per sample, or the base model for all), in
        bounded forwards of one key each; under DeepSpeed with several processes in the same order on each."""
        same_order = stand_in = None
        if self.alignment.aligns_forwards:  # several processes under DeepSpeed (ZeRO-3 gathers)
            own = batch.adapters
            base = adapters[0] not in own  # through the base model (no adapter), or each sample's own adapter

            def same_order(groups: list[list[int]]) -> list:
                return self.alignment.same_order(groups, lambda rows: own[rows[0]], batch.prompt_ids.device)

            def stand_in(adapter: str) -> tuple[TrainingBatch, list[str]]:
                stand = self.alignment.stand_in(batch, adapter, self.pad_token_id)
                return stand, [adapters[0] if base else adapter]

        return bounded_logps(
            batch,
            adapters,
            max_samples=self.max_samples,
            max_tokens=self.max_tokens,
            forward=forward,
            keys=keys,
            same_order=same_order,
            stand_in=stand_in,
            packed=self.packed,
        )


def first_of_each_adapter(plan: Sequence[tuple[str, TrainingBatch]]) -> list[bool]:
    """For each mini-batch of a plan (`mini_batches.mini_batch_plan`), whether it is its adapter's
    first: no update has moved that adapter yet when it trains, so its policy ratio is exactly one and TRL's loss
    takes the log-probs before the update from its own forward (detached), with no forward of their own."""
    seen: set[str] = set()
    first = []
    for adapter, _ in plan:
        first.append(adapter not in seen)
        seen.add(adapter)
    return first


def old_logps_after_first(
    plan: Sequence[tuple[str, TrainingBatch]], logps: Callable[[TrainingBatch], torch.Tensor]
) -> list[tuple[str, TrainingBatch]]:
    """``plan`` with the log-probs before the update (``logps(mini-batch)``, `[n, C]`) on every mini-batch but each
    adapter's first, computed now, before any of them trains."""
    return [
        (adapter, part if first else replace(part, old_per_token_logps=logps(part)))
        for (adapter, part), first in zip(plan, first_of_each_adapter(plan))
    ]


def rollout_logps(batch: TrainingBatch, *, backend: str) -> torch.Tensor:
    """`[N, C]`: the rollout backend's log-probs of ``batch``'s sampled tokens, which `old_logprobs="rollout"` takes
    as the log-probs before the update in place of a forward; an error naming the fix where ``backend`` (its name)
    reported none, or none for some completion token (a vLLM server sends -inf as null)."""
    sampled = batch.sampling_per_token_logps
    if sampled is None:
        raise ValueError(
            f"old_logprobs='rollout' takes the log-probs before the update from the rollout backend, and {backend} "
            "returned calls without them: use the transformers or vLLM backend, make a custom backend fill "
            "`GenerationResult.sampling_logprobs` (one per completion token), or set old_logprobs='recompute'."
        )
    missing = int((sampled.isnan() & batch.completion_mask.bool()).sum())
    if missing:
        raise ValueError(
            f"old_logprobs='rollout': {backend} sent no log-prob for {missing} sampled token(s) (a vLLM server sends "
            "-inf as null: a token the sampler gave no probability, under a truncating sampler); set "
            "old_logprobs='recompute'."
        )
    return sampled
