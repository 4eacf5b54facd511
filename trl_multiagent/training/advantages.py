"""GRPO advantages over whole-workflow outcomes: the episodes of one prompt form a group."""

from __future__ import annotations

import torch
from trl.trainer.utils import nanstd


def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> torch.Tensor:
    """Advantage of every episode from its outcome reward.

    Args:
        rewards: `[E]` outcome reward per episode over *all* processes, the `num_generations` episodes of one prompt
            next to each other (TRL's RepeatSampler order). NaN marks an unscorable episode: it is left out of its
            group's statistics and gets advantage 0.
        scale_rewards: "group" (divide by the group std), "batch" (by the std over all episodes) or "none".

    Returns:
        `[E]` advantages, to broadcast to every model call of the episode.
    """
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} episode rewards do not split into groups of {num_generations}.")
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    advantages = (grouped - mean).view(-1)
    if scale_rewards == "group":
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards)
    elif scale_rewards == "none":
        std = None
    else:
        raise ValueError(f"`scale_rewards` must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    if std is not None:
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)
