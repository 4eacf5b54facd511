"""GRPO advantages. ``advantage_groups``: "episodes", the episodes of one prompt form a group (TRL's); "calls", every
model call a sample, grouped per prompt and the workflow's group key (the reference's grouping); "roles", per prompt,
role and instance with a role instance's calls in an episode pooled."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import partial

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


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`[E]` weighted sum of `[E, F]` reward-function outputs (NaN where a function did not score), NaN for an
    episode no function scored: the reward TRL logs as ``reward`` under either ``multi_objective_aggregation``."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def outcome_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_generations: int,
    scale_rewards: str,
    aggregation: str = "sum_then_normalize",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[E]` episode rewards and advantages from `[E, F]` reward-function outputs (all processes; NaN where a
    function did not score), as TRL's ``multi_objective_aggregation`` defines them.

    "sum_then_normalize": the weighted sum, then GRPO over the episodes of a prompt (``group_advantages``).
    "normalize_then_sum": each function normalised within each prompt's episodes, the weighted sum of those, then
    normalised over the batch; the rewards returned are that normalised sum (what the advantages come from), not the
    ``weighted_rewards`` TRL logs. An episode no function scored has reward NaN and advantage 0.
    """
    if aggregation == "normalize_then_sum":
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        weights = weights.to(rewards_per_func.device).unsqueeze(0)
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        mean, std = torch.nanmean(grouped, dim=1, keepdim=True), nanstd(grouped, dim=1, keepdim=True)
        per_func = ((grouped - mean) / (torch.nan_to_num(std, nan=0.0) + 1e-4)).view_as(rewards_per_func)
        rewards = (per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        return rewards, torch.nan_to_num((rewards - torch.nanmean(rewards)) / (std + 1e-4), nan=0.0)
    rewards = weighted_rewards(rewards_per_func, weights)
    return rewards, group_advantages(rewards, num_generations, scale_rewards)


def trajectory_advantages(
    trajectories: Sequence[tuple[int, Hashable, int]],
    rewards: Sequence[float],
    *,
    num_generations: int,
    scale_rewards: str = "group",
) -> list[float]:
    """Advantages of role trajectories, one group per prompt, role and instance (``advantage_groups="roles"``).

    Args:
        trajectories: `(episode, role, instance)` of every trajectory (a role instance's calls in one episode,
            pooled), over all processes; ``episode // num_generations`` is its prompt.
        rewards: one reward per trajectory (NaN: unscorable, left out of its group's statistics, advantage 0).
        scale_rewards: "group" divides by the group's (unbiased) std, "batch" by the std over all trajectories,
            "none" by nothing. The std carries eps 1e-6. A group of one gets advantage 0.
    """
    keys = [(episode // num_generations, role, instance) for episode, role, instance in trajectories]
    return _normalise_in_groups(keys, rewards, scale_rewards=scale_rewards, lone_keeps_score=False)


def call_group_advantages(
    keys: Sequence[Hashable], rewards: Sequence[float], scale_rewards: str = "group"
) -> list[float]:
    """verl's GRPO advantage (``compute_grpo_outcome_advantage``) of samples grouped by ``keys`` (the reference's
    uid): mean and unbiased std per group, eps 1e-6; a group of one keeps its raw score (verl's mean 0, std 1).
    NaN rewards are unscorable: left out of their group's statistics (a group with one scorable sample is a group of
    one) and given advantage 0. ``scale_rewards`` as in ``trajectory_advantages``."""
    return _normalise_in_groups(keys, rewards, scale_rewards=scale_rewards, lone_keeps_score=True)


def _normalise_in_groups(
    keys: Sequence[Hashable], rewards: Sequence[float], *, scale_rewards: str, lone_keeps_score: bool
) -> list[float]:
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"`scale_rewards` must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    values = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
    advantages = torch.zeros_like(values)
    batch_std = _unbiased_std(values) if scale_rewards == "batch" else None
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    for rows in groups.values():
        group = values[rows]
        if lone_keeps_score and int((~torch.isnan(group)).sum()) == 1:
            mean, std = torch.zeros((), dtype=values.dtype), torch.ones((), dtype=values.dtype)
        else:
            mean, std = torch.nanmean(group), _unbiased_std(group)
        centred = group - mean
        if scale_rewards == "group":
            centred = centred / (std + 1e-6)
        elif scale_rewards == "batch":
            centred = centred / (batch_std + 1e-6)
        advantages[rows] = centred
    return torch.nan_to_num(advantages, nan=0.0).tolist()


def _unbiased_std(values: torch.Tensor) -> torch.Tensor:
    """The unbiased std of the non-NaN ``values`` in float64 (TRL's ``nanstd`` rounds Bessel's correction to float32);
    0 with fewer than two."""
    scored = values[~torch.isnan(values)]
    return scored.std() if scored.numel() > 1 else torch.zeros((), dtype=values.dtype)


def call_advantages(
    episodes: Sequence,
    *,
    first_episode: int,
    episode_advantages: torch.Tensor,
    rewards: torch.Tensor,
    group_key: Callable[[str, int], str],
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
    ``trajectory_advantages`` over the episodes' outcome ``rewards`` (`[E_all]`). ``groups="calls"`` (the
    reference's): every call is a sample with its episode's outcome reward, grouped per prompt and
    ``group_key(role, instance)`` (``Workflow.group_key``; ``call_group_advantages``).

    ``role_rewards`` (per episode, per call; None where a call has none) get advantages of their own in the same
    groups: under "calls" each call's own, otherwise pooled per role trajectory (their mean) and normalised in role
    groups. A call with a role reward gets ``(1 - role_reward_weight) * outcome advantage + role_reward_weight *
    role advantage`` (weight 1, the reference's per-role variant: the role reward replaces the outcome), one without
    its outcome advantage. ``gather_object`` collects every process's calls or trajectories, so groups span processes.
    """
    calls = [c for e in episodes for c in e.calls]
    episode_of = [first_episode + i for i, e in enumerate(episodes) for _ in e.calls]
    by_role = [r for per_episode in role_rewards for r in per_episode] if role_rewards is not None else None
    if groups == "calls":
        keys = [(e, j, group_key(c.role, c.instance)) for j, (e, c) in enumerate(zip(episode_of, calls))]
        per_groups = _per_call_groups
    else:
        keys = [(e, c.role, c.instance) for e, c in zip(episode_of, calls)]
        per_groups = _per_trajectory_groups
    normalise = partial(
        per_groups, keys, num_generations=num_generations, scale_rewards=scale_rewards, gather_object=gather_object
    )
    if groups == "episodes":
        outcome = [float(episode_advantages[e]) for e in episode_of]
    else:
        by_key = normalise([float(rewards[e]) for e in episode_of])
        outcome = [by_key[key] for key in keys]
    if by_role is None:
        return outcome
    role_advantage, w = normalise(by_role), role_reward_weight
    return [(1 - w) * a + w * role_advantage[key] if key in role_advantage else a for key, a in zip(keys, outcome)]


def _per_call_groups(keys, values, *, num_generations: int, scale_rewards: str, gather_object) -> dict:
    """``call_group_advantages`` of every process's calls with a value (``keys``: (episode, call index within this
    process, group key)), grouped per prompt and group key: {key: advantage}."""
    local = [(key, value) for key, value in zip(keys, values) if value is not None]
    gathered = [((episode, j, group), value) for (episode, j, group), value in gather_object(local)]
    groups = [(episode // num_generations, group) for (episode, _, group), _ in gathered]
    advantages = call_group_advantages(groups, [value for _, value in gathered], scale_rewards)
    return {key: a for (key, _), a in zip(gathered, advantages)}


def _per_trajectory_groups(keys, values, *, num_generations: int, scale_rewards: str, gather_object) -> dict:
    """``trajectory_advantages`` of every process's role trajectories (``keys``: (episode, role, instance) of each
    call), a trajectory's values pooled by their mean (None left out): {key: advantage}."""
    pooled: dict[tuple, list[float]] = {}
    for key, value in zip(keys, values):
        if value is not None:
            pooled.setdefault(key, []).append(value)
    local = sorted((key, sum(v) / len(v)) for key, v in pooled.items())
    gathered = [(tuple(key), value) for key, value in gather_object(local)]
    advantages = trajectory_advantages(
        [k for k, _ in gathered],
        [v for _, v in gathered],
        num_generations=num_generations,
        scale_rewards=scale_rewards,
    )
    return {key: a for (key, _), a in zip(gathered, advantages)}
