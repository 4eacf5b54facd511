"""GRPO advantages over whole-workflow outcomes: the episodes of one prompt form a group."""

from __future__ import annotations

from collections.abc import Sequence

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


def outcome_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    scale_rewards: str,
    aggregation: str = "sum_then_normalize",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[E]` episode rewards and advantages from `[E, F]` reward-function outputs (all processes; NaN where a
    function did not score), as TRL's ``multi_objective_aggregation`` defines them.

    "sum_then_normalize": the weighted sum, then GRPO over the episodes of a prompt (``group_advantages``).
    "normalize_then_sum": each function normalised within each prompt's episodes, the weighted sum of those, then
    normalised over the batch. An episode no function scored has reward NaN and advantage 0.
    """
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    weights = weights.to(rewards_per_func.device).unsqueeze(0)
    if aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        mean, std = torch.nanmean(grouped, dim=1, keepdim=True), nanstd(grouped, dim=1, keepdim=True)
        per_func = ((grouped - mean) / (torch.nan_to_num(std, nan=0.0) + 1e-4)).view_as(rewards_per_func)
        rewards = (per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        return rewards, torch.nan_to_num((rewards - torch.nanmean(rewards)) / (std + 1e-4), nan=0.0)
    rewards = (rewards_per_func * weights).nansum(dim=1)
    rewards[unscorable] = torch.nan
    return rewards, group_advantages(rewards, num_generations, scale_rewards)


def trajectory_advantages(
    trajectories: Sequence[tuple[int, int, int]],
    rewards: Sequence[float],
    num_generations: int,
    scale_rewards: str = "group",
) -> list[float]:
    """Advantages of role trajectories grouped the reference's way: one group per prompt, role and instance.

    Args:
        trajectories: `(episode, role, instance)` of every trajectory (a role instance's calls in one episode,
            pooled), over all processes; ``episode // num_generations`` is its prompt.
        rewards: one reward per trajectory (NaN: unscorable, left out of its group's statistics, advantage 0).
        scale_rewards: "group" divides by the group's (unbiased) std, "batch" by the std over all trajectories,
            "none" by nothing. The std carries eps 1e-6, the reference's.
    """
    values = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
    keys = [(episode // num_generations, role, instance) for episode, role, instance in trajectories]
    advantages = torch.zeros_like(values)
    batch_std = nanstd(values) if scale_rewards == "batch" else None
    for key in set(keys):
        rows = torch.tensor([k == key for k in keys])
        group = values[rows]
        centred = group - torch.nanmean(group)
        if scale_rewards == "group":
            centred = centred / (torch.nan_to_num(nanstd(group), nan=0.0) + 1e-6)
        elif scale_rewards == "batch":
            centred = centred / (batch_std + 1e-6)
        elif scale_rewards != "none":
            raise ValueError(f"`scale_rewards` must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
        advantages[rows] = centred
    return torch.nan_to_num(advantages, nan=0.0).tolist()


def call_advantages(
    episodes: Sequence,
    first_episode: int,
    episode_advantages: torch.Tensor,
    rewards: torch.Tensor,
    roles: Sequence[str],
    num_generations: int,
    scale_rewards: str,
    groups: str,
    gather_object,
    role_rewards: Sequence[Sequence[float | None]] | None = None,
    role_reward_weight: float = 1.0,
) -> list[float]:
    """The advantage of every call of this process's ``episodes`` (``Episode`` records), in call order.

    ``groups="episodes"``: each call carries its episode's advantage (``episode_advantages``, `[E_all]`, GRPO over
    the episodes of a prompt). ``groups="roles"``: each call carries its role trajectory's advantage from
    ``trajectory_advantages`` over the episodes' outcome ``rewards`` (`[E_all]`). ``role_rewards`` (per episode, per
    call; None where a role has none) are pooled per trajectory (their mean), normalised in role groups and mixed in:
    ``(1 - role_reward_weight) * outcome advantage + role_reward_weight * role advantage``. ``gather_object``
    collects every process's trajectories, so groups span processes.
    """
    keys = [(first_episode + i, roles.index(c.role), c.instance) for i, e in enumerate(episodes) for c in e.calls]
    if groups == "episodes":
        outcome = [float(episode_advantages[key[0]]) for key in keys]
    else:
        trajectories = [tuple(t) for t in gather_object(sorted(set(keys)))]
        values = [float(rewards[episode]) for episode, _, _ in trajectories]
        advantage = dict(
            zip(trajectories, trajectory_advantages(trajectories, values, num_generations, scale_rewards))
        )
        outcome = [advantage[key] for key in keys]
    if role_rewards is None:
        return outcome
    pooled: dict[tuple, list[float]] = {}
    for key, value in zip(keys, (r for per_episode in role_rewards for r in per_episode)):
        if value is not None:
            pooled.setdefault(key, []).append(value)
    local = sorted((key, sum(v) / len(v)) for key, v in pooled.items())
    gathered = [(tuple(key), value) for key, value in gather_object(local)]
    values = trajectory_advantages([k for k, _ in gathered], [v for _, v in gathered], num_generations, scale_rewards)
    role_advantage = {key: value for (key, _), value in zip(gathered, values)}
    w = role_reward_weight
    return [(1 - w) * a + w * role_advantage[key] if key in role_advantage else a for key, a in zip(keys, outcome)]
