"""TRL's correction for the gap between the rollout engine's sampling policy and the trained one."""

from __future__ import annotations

import math

import torch


def batch_importance_sampling_ratio(batch, args) -> torch.Tensor:
    """The correction of a `TrainingBatch` whose old and sampling log-probs are filled: `[N, C]` for token modes,
    `[N, 1]` for sequence modes, computed as TRL computes it for vLLM rollouts, with the `vllm_importance_sampling_*`
    settings of ``args``.

    "truncate" clamps to [clip_min, clip_max], "mask" zeroes the ratios outside. A NaN sampling log-prob counts as
    no gap, as in TRL.
    """
    mode = args.vllm_importance_sampling_mode
    clip_min, clip_max = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
    gap = (batch.old_per_token_logps - batch.sampling_per_token_logps) * batch.completion_mask
    diff = torch.nan_to_num(gap, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def fold_into_advantages(advantages: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """`[N, C]` (or `[N, 1]`) advantages that apply the correction inside TRL's policy loss.

    TRL multiplies each token's policy loss by the ratio; every TRL policy loss except VESPO (which reads the ratio
    itself) is linear in the advantage for a non-negative factor, so scaling the advantage is the same product.
    """
    return advantages.unsqueeze(1) * ratio
