"""Step 3 of a training step: every model call of this process's episodes one training sample.

Each call carries its episode's (or its role trajectory's, or its own group's) advantage (advantages.py), is padded
into the `TrainingBatch` the loss reads (batch.py), weighted by its role (loss_weights.py), and the batch counts its
samples and completion tokens over every process, as TRL's loss normalises by them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .advantages import call_advantages
from .batch import TrainingBatch, calls_to_batch
from .episode_rewards import EpisodeRewards
from .loss_weights import role_weights


def episode_samples(
    episodes: Sequence,
    rewards: EpisodeRewards,
    *,
    args,
    role_rewards: Sequence[Sequence[float | None]] | None,
    group_key: Callable[[str, int], str],
    num_generations: int,
    role_loss_weights: dict[str, float],
    max_prompt_length: int | None,
    pad_token_ids: Callable[[list], int | list[int]],
    device: torch.device,
    gather: Callable[[torch.Tensor], torch.Tensor],
    gather_object: Callable[[list], list],
) -> TrainingBatch:
    """The samples of this process's ``episodes`` (``Episode`` records), in call order, with their ``rewards`` (step
    2's, over every process's episodes).

    ``args``: the run's settings (`MultiAgentGRPOConfig`), read for the advantages' groups and scale
    (``advantage_groups``, ``scale_rewards``, ``role_reward_weight``), the role weights (``role_loss_balance``,
    ``loss_type``) and ``mask_truncated_completions``; ``role_rewards`` and ``group_key`` are `call_advantages`',
    ``role_loss_weights`` `role_weights`'; ``pad_token_ids(calls)`` the pad id of each call's base (or one id);
    ``max_prompt_length`` the limit that ended episodes as dropped (named in the error when every one was)."""
    first_episode = rewards.first
    advantages = call_advantages(
        episodes,
        first_episode=first_episode,
        episode_advantages=rewards.advantages,
        rewards=rewards.rewards,
        group_key=group_key,
        num_generations=num_generations,
        scale_rewards=args.scale_rewards,
        groups=args.advantage_groups,
        gather_object=gather_object,
        role_rewards=role_rewards,
        role_reward_weight=args.role_reward_weight,
    )
    calls = [c for e in episodes for c in e.calls]
    if not calls and any(e.dropped for e in episodes):
        raise ValueError(
            "Every episode of this batch ended on a prompt over max_prompt_length="
            f"{max_prompt_length} tokens, so nothing is left to train on: raise the limit, or train "
            "on shorter problems."
        )
    episode_ids = [first_episode + e.index for e in episodes for _ in e.calls]
    batch = calls_to_batch(
        calls,
        advantages,
        episode_ids,
        pad_token_id=pad_token_ids(calls),
        device=device,
        mask_truncated_completions=args.mask_truncated_completions,
    )
    tokens = batch.completion_mask.sum(dim=1)
    batch.sample_weights = role_weights(
        batch.roles,
        tokens,
        role_loss_weights=role_loss_weights,
        balance=args.role_loss_balance,
        loss_type=args.loss_type,
    )
    totals = gather(torch.stack([batch.num_samples_in_batch, batch.num_items_in_batch])[None]).sum(dim=0)
    batch.num_samples_in_batch = totals[0]
    batch.num_items_in_batch = totals[1]
    return batch
