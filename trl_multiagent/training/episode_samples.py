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
from .loss_weights import role_weights


def episode_samples(
    episodes: Sequence,
    *,
    first_episode: int,
    episode_advantages: torch.Tensor,
    rewards: torch.Tensor,
    role_rewards: Sequence[Sequence[float | None]] | None,
    group_key: Callable[[str, int], str],
    num_generations: int,
    scale_rewards: str,
    advantage_groups: str,
    role_reward_weight: float,
    role_loss_weights: dict[str, float],
    role_loss_balance: str,
    loss_type: str,
    mask_truncated_completions: bool,
    max_prompt_length: int | None,
    pad_token_ids: Callable[[list], int | list[int]],
    device: torch.device,
    gather: Callable[[torch.Tensor], torch.Tensor],
    gather_object: Callable[[list], list],
) -> TrainingBatch:
    """The samples of this process's ``episodes`` (``Episode`` records; the first is episode ``first_episode`` of
    the `[E_all]` ``rewards`` and ``episode_advantages`` gathered over processes), in call order.

    ``role_rewards``, ``group_key`` and the grouping settings are `call_advantages`'; ``role_loss_weights`` and
    ``role_loss_balance`` `role_weights`'; ``pad_token_ids(calls)`` the pad id of each call's base (or one id);
    ``max_prompt_length`` the limit that ended episodes as dropped (named in the error when every one was)."""
    advantages = call_advantages(
        episodes,
        first_episode=first_episode,
        episode_advantages=episode_advantages,
        rewards=rewards,
        group_key=group_key,
        num_generations=num_generations,
        scale_rewards=scale_rewards,
        groups=advantage_groups,
        gather_object=gather_object,
        role_rewards=role_rewards,
        role_reward_weight=role_reward_weight,
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
        mask_truncated_completions=mask_truncated_completions,
    )
    tokens = batch.completion_mask.sum(dim=1)
    batch.sample_weights = role_weights(
        batch.roles,
        tokens,
        role_loss_weights=role_loss_weights,
        balance=role_loss_balance,
        loss_type=loss_type,
    )
    totals = gather(torch.stack([batch.num_samples_in_batch, batch.num_items_in_batch])[None]).sum(dim=0)
    batch.num_samples_in_batch = totals[0]
    batch.num_items_in_batch = totals[1]
    return batch
