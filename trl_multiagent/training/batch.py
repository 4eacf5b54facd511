"""The typed batch between generation and the loss, and the one place where it becomes TRL's tensor dict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from ..rollout.padding import padded
from ..rollout.records import ModelCall


@dataclass
class TrainingBatch:
    """One training sample per model call (N calls; P = longest prompt, C = longest completion).

    Per-sample fields are sliced together by `select`; the two counts are totals over the whole generation batch of
    every process (TRL's normalisers), so they travel unchanged into every micro-batch.
    """

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    completion_ids: torch.Tensor  # [N, C] right-padded
    completion_mask: torch.Tensor  # [N, C]; all zero for a truncated call under `mask_truncated_completions`
    advantages: torch.Tensor  # [N] the episode's advantage (times the sample weight once split for the loss)
    roles: list[str]  # [N] role type of each call
    adapters: list[str]  # [N] adapter that produced it and trains on it
    instances: torch.Tensor  # [N] which parallel copy of its role
    episode_ids: torch.Tensor  # [N] episode index over all processes
    truncated: torch.Tensor  # [N] bool: stopped by the length limit
    sample_weights: torch.Tensor  # [N] role weight x balance x micro-batch correction
    num_items_in_batch: torch.Tensor  # scalar: completion tokens of the generation batch, all processes
    num_samples_in_batch: torch.Tensor  # scalar: calls of the generation batch, all processes
    sampling_per_token_logps: torch.Tensor | None = None  # [N, C] from backends that report them (vLLM)
    old_per_token_logps: torch.Tensor | None = None  # [N, C] before this generation's updates, when needed
    ref_per_token_logps: torch.Tensor | None = None  # [N, C] base model (adapters bypassed), for the KL term
    importance_sampling_ratio: torch.Tensor | None = None  # [N, C] or [N, 1]: rollout-vs-trained correction

    def __len__(self) -> int:
        return len(self.roles)

    def select(self, rows: torch.Tensor | slice | list[int]) -> TrainingBatch:
        """The samples at ``rows`` (a slice, indices or a bool mask), every per-sample field alike."""
        if isinstance(rows, torch.Tensor) and rows.dtype == torch.bool:
            rows = rows.nonzero().flatten().tolist()
        index = rows if isinstance(rows, slice) else torch.as_tensor(rows).long()  # one index for every tensor
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                picked[f.name] = value[rows] if isinstance(rows, slice) else [value[i] for i in rows]
            elif torch.is_tensor(value) and value.dim() > 0:
                picked[f.name] = value[index]
        return replace(self, **picked)

    def blank_rows(self, rows: int, *, pad_token_id: int) -> TrainingBatch:
        """``rows`` copies of the first sample (its adapter, role and widths) that train nothing: padding tokens, no
        completion token, zero advantage and weight, log-probs of zero and an importance ratio of one."""
        blank = self.select([0] * rows)
        zeros = torch.zeros_like(blank.advantages)
        cleared = {
            name: torch.zeros_like(value)
            for name in ("sampling_per_token_logps", "old_per_token_logps", "ref_per_token_logps")
            if (value := getattr(blank, name)) is not None
        }
        if blank.importance_sampling_ratio is not None:
            cleared["importance_sampling_ratio"] = torch.ones_like(blank.importance_sampling_ratio)
        return replace(
            blank,
            prompt_ids=torch.full_like(blank.prompt_ids, pad_token_id),
            completion_ids=torch.full_like(blank.completion_ids, pad_token_id),
            completion_mask=torch.zeros_like(blank.completion_mask),
            advantages=zeros,
            sample_weights=zeros,
            truncated=torch.zeros_like(blank.truncated),
            **cleared,
        )

    def lengths(self) -> tuple[list[int], list[int]]:
        """Prompt and completion tokens of each sample (completion: up to its last unmasked token)."""
        positions = torch.arange(1, self.completion_mask.size(1) + 1, device=self.completion_mask.device)
        completion = (self.completion_mask * positions).max(dim=1).values
        return self.prompt_mask.sum(dim=1).tolist(), completion.tolist()

    def trimmed(self) -> TrainingBatch:
        """The same samples without the padding columns none of them uses (left of the prompts, right of the
        completions), so a micro-batch of short samples costs what its samples need."""
        prompts, completions = self.lengths()
        width_p, width_c = max(prompts), max(max(completions), 1)
        full_p, full_c = self.prompt_ids.size(1), self.completion_ids.size(1)
        trimmed = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if (
                torch.is_tensor(value)
                and value.dim() == 2
                and value.size(1) == full_c
                and f.name.startswith(("completion", "advantages", "sampling", "old", "ref", "importance"))
            ):
                trimmed[f.name] = value[:, :width_c]
            elif torch.is_tensor(value) and value.dim() == 2 and f.name.startswith("prompt"):
                trimmed[f.name] = value[:, full_p - width_p :]
        return replace(self, **trimmed)

    def shuffled(self) -> TrainingBatch:
        return self.select(torch.randperm(len(self)).tolist())

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`[N, P + C]` input ids and attention mask of the full sequences, and the completion width C."""
        input_ids = torch.cat([self.prompt_ids, self.completion_ids], dim=1)
        attention_mask = torch.cat([self.prompt_mask, self.completion_mask], dim=1)
        return input_ids, attention_mask, self.completion_ids.size(1)

    def to_trl_inputs(self) -> dict:
        """The dict that ``GRPOTrainer._compute_loss`` reads. Advantages must already carry the sample weights."""
        inputs = {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "completion_ids": self.completion_ids,
            "completion_mask": self.completion_mask,
            "advantages": self.advantages,
            "num_items_in_batch": self.num_items_in_batch,
        }
        for name in ("old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio"):
            if getattr(self, name) is not None:
                inputs[name] = getattr(self, name)
        return inputs


def calls_to_batch(
    calls: list[ModelCall],
    advantages: list[float],
    episode_ids: list[int],
    *,
    pad_token_id: int | Sequence[int],
    device: torch.device,
    mask_truncated_completions: bool = False,
) -> TrainingBatch:
    """Pad the calls into a `TrainingBatch`; weights start at 1 and the counts at this process's own totals.
    ``pad_token_id``: one id, or one per call (calls on several base models, each padded with its tokenizer's)."""
    if not calls:
        raise ValueError("The workflow made no model call in this batch: there is nothing to train on.")
    width_p = max(len(c.prompt_ids) for c in calls)
    width_c = max(max(len(c.completion_ids) for c in calls), 1)
    pads = pad_token_id if isinstance(pad_token_id, int) else list(pad_token_id)
    prompt_ids, prompt_mask = padded([c.prompt_ids for c in calls], pads, side="left", width=width_p)
    completion_ids, completion_mask = padded([c.completion_ids for c in calls], pads, side="right", width=width_c)
    if mask_truncated_completions:
        completion_mask[torch.tensor([c.truncated for c in calls], dtype=torch.bool)] = 0
    sampling = None
    if all(c.sampling_logprobs is not None for c in calls):
        sampling = torch.zeros((len(calls), width_c), dtype=torch.float32)
        for row, call in enumerate(calls):
            sampling[row, : len(call.sampling_logprobs)] = torch.tensor(call.sampling_logprobs)
        sampling = sampling.to(device)
    completion_mask = completion_mask.to(device)
    return TrainingBatch(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=completion_ids.to(device),
        completion_mask=completion_mask,
        advantages=torch.tensor(advantages, dtype=torch.float32, device=device),
        roles=[c.role for c in calls],
        adapters=[c.adapter for c in calls],
        instances=torch.tensor([c.instance for c in calls], device=device),
        episode_ids=torch.tensor(episode_ids, device=device),
        truncated=torch.tensor([c.truncated for c in calls], device=device),
        sample_weights=torch.ones(len(calls), device=device),
        num_items_in_batch=completion_mask.sum().float(),
        num_samples_in_batch=torch.tensor(float(len(calls)), device=device),
        sampling_per_token_logps=sampling,
    )
