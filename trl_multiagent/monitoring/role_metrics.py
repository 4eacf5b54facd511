"""Per-role metric arithmetic of the trainer's tensors: pure functions, the trainer only gathers and logs.

Each `*_sums` function reduces one process's samples to a `[R, K]` tensor of sums per role (rows in the workflow's
role order), so the trainer can add them up across processes with one reduction; the matching `*_metrics` function
turns the summed tensor into `role/<role>/...` values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..seams.trl import nanstd


def role_rows(roles: Sequence[str], sample_roles: Sequence[str], device: torch.device) -> torch.Tensor:
    """`[R, N]` float indicator: row r marks the samples of ``roles[r]``."""
    return torch.tensor([[float(s == role) for s in sample_roles] for role in roles], device=device).view(
        len(roles), len(sample_roles)
    )


def token_stat_sums(
    roles: Sequence[str],
    batch,
    *,
    logps: torch.Tensor,
    entropies: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> torch.Tensor:
    """`[R, 6]` masked token sums per role of entropy, negative log-prob, policy ratio, (ratio - 1)^2, clipped, count.

    ``batch`` is the micro-batch (a `TrainingBatch`: roles, completion mask, and the rollout policy's log-probs).
    The ratio compares the trained policy with the rollout policy: the backend's sampling log-probs when it reports
    them, else the log-probs from before this generation's updates; with neither, it is exactly 1.
    """
    rollout = batch.sampling_per_token_logps
    rollout = batch.old_per_token_logps if rollout is None else rollout
    ratio = torch.exp(logps - rollout) if rollout is not None else torch.ones_like(logps)
    clipped = (ratio < 1 - epsilon_low) | (ratio > 1 + epsilon_high)
    per_token = torch.stack([entropies, -logps, ratio, (ratio - 1) ** 2, clipped.float(), torch.ones_like(logps)])
    rows = role_rows(roles, batch.roles, logps.device)
    return torch.einsum("rn,knt,nt->rk", rows, per_token.float(), batch.completion_mask.float())


def token_stat_metrics(roles: Sequence[str], sums: torch.Tensor) -> dict[str, float]:
    """Per-role entropy, perplexity of the sampled tokens, policy ratio, chi-square and clip fraction."""
    metrics = {}
    for role, (entropy, nll, ratio, chi, clip, tokens) in zip(roles, sums.tolist()):
        if tokens:
            metrics[f"role/{role}/entropy"] = entropy / tokens
            metrics[f"role/{role}/perplexity"] = float(torch.exp(torch.tensor(nll / tokens)))
            metrics[f"role/{role}/policy_ratio"] = ratio / tokens
            metrics[f"role/{role}/chi_square"] = chi / tokens
            metrics[f"role/{role}/clip_fraction"] = clip / tokens
    return metrics


def role_kl_metrics(roles: Sequence[str], sample_roles: Sequence[str], *, per_token_kl, mask) -> dict[str, float]:
    """`role/<role>/kl` for each role with samples here: mean per-token KL to the base model over its tokens."""
    present = [role for role in roles if role in sample_roles]
    rows = role_rows(present, sample_roles, mask.device)
    sums = rows @ (per_token_kl * mask).sum(dim=1).float()
    tokens = rows @ mask.sum(dim=1).float()
    return {f"role/{r}/kl": (s / t.clamp(min=1)).item() for r, s, t in zip(present, sums, tokens)}


def rollout_sums(
    roles: Sequence[str],
    sample_roles: Sequence[str],
    *,
    completion_tokens: torch.Tensor,
    truncated: torch.Tensor,
    advantages: torch.Tensor,
) -> torch.Tensor:
    """`[R, 4]` per role: calls, completion tokens, truncated calls, advantage sum."""
    per_sample = torch.stack([torch.ones_like(advantages), completion_tokens.float(), truncated.float(), advantages])
    return role_rows(roles, sample_roles, advantages.device) @ per_sample.T


def rollout_metrics(
    roles: Sequence[str],
    sums: torch.Tensor,
    *,
    rewards: torch.Tensor,
    rewards_per_func: torch.Tensor,
    reward_names: Sequence[str],
    calls_per_episode: torch.Tensor,
    batch,
) -> dict[str, float]:
    """What one generation batch looked like, from tensors gathered over every process.

    ``sums``: `[R, 4]` from `rollout_sums`, summed over processes; ``rewards``: `[E]` outcome rewards (NaN where
    unscorable); ``rewards_per_func``: `[E, F]`; ``calls_per_episode``: `[E]`; ``batch``: the `TrainingBatch`.
    Logs the outcome (`workflow/success`, TRL's `reward`, `reward_std`, `rewards/<name>/mean|std`) and per role
    `role/<role>/calls` always, completion length, truncated fraction and mean advantage when it made calls.
    """
    metrics = {
        "workflow/samples_generated": batch.num_samples_in_batch.item(),
        "workflow/calls_per_episode": calls_per_episode.mean().item(),
        "workflow/success": torch.nanmean(rewards).item(),
        "reward": torch.nanmean(rewards).item(),
        "reward_std": nanstd(rewards).item(),
    }
    for i, name in enumerate(reward_names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    for role, (calls, tokens, truncated, advantage) in zip(roles, sums.tolist()):
        metrics[f"role/{role}/calls"] = calls
        if calls:
            metrics[f"role/{role}/completion_length"] = tokens / calls
            metrics[f"role/{role}/truncated_fraction"] = truncated / calls
            metrics[f"role/{role}/advantage"] = advantage / calls
    return metrics


def grad_norm_metrics(
    adapter_squares: dict[str, float], role_adapters: dict[str, str], role_squares: dict[str, float]
) -> dict[str, float]:
    """Pre-clipping gradient norm of each adapter and role, and its share of the squared total.

    An adapter that serves one role carries exactly that role's contribution; roles sharing an adapter are measured
    through ``role_squares`` (their shadows' gradients), and their shares are relative to all role contributions, so
    they are logged only when every trained role's contribution is known. A share of nothing has no value: where
    every square is 0 (no adapter got a gradient) no share is logged.
    """
    metrics = {}
    total = sum(adapter_squares.values())
    role_squares = dict(role_squares)
    for adapter, square in adapter_squares.items():
        metrics[f"adapter/{adapter}/grad_norm"] = square**0.5
        if total:
            metrics[f"adapter/{adapter}/grad_norm_share"] = square / total
        roles = [r for r, a in role_adapters.items() if a == adapter]
        if len(roles) == 1:
            role_squares[roles[0]] = square
    role_total = sum(role_squares.values())
    every_role = all(role in role_squares for role, adapter in role_adapters.items() if adapter in adapter_squares)
    for role, square in role_squares.items():
        metrics[f"role/{role}/grad_norm"] = square**0.5
        if role_total and every_role:
            metrics[f"role/{role}/grad_norm_share"] = square / role_total
    return metrics


def update_metrics(updates: Sequence, role_adapters: dict[str, str]) -> dict[str, float]:
    """The ``adapter/`` and ``role/`` metrics of one training step from what each of its optimizer updates measured
    before it (``GradientAccounts.step_measured``: a ``GradientNorms`` per update; none: nothing measured, no metric).

    A step takes one update under ``update_schedule="merged"`` and one per mini-batch under ``"mini_batches"``: the
    norms are the step's, each adapter's and role's squared norms summed over the updates (so an adapter that took
    three mini-batch steps counts all three, and the shares of a step add up to 1); the coherence values are their
    means over the updates that damped the adapter.
    """
    if not updates:
        return {}
    metrics = grad_norm_metrics(
        _summed([u.adapter_squares for u in updates]), role_adapters, _summed([u.role_squares for u in updates])
    )
    damped: dict[str, list[tuple[float, float]]] = {}
    for update in updates:
        for adapter, values in update.coherence.items():
            damped.setdefault(adapter, []).append(values)
    for adapter, values in damped.items():
        metrics[f"adapter/{adapter}/coherence_cos"] = sum(cosine for cosine, _ in values) / len(values)
        metrics[f"adapter/{adapter}/coherence_scale"] = sum(scale for _, scale in values) / len(values)
    return metrics


def _summed(squares: Sequence[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for update in squares:
        for key, square in update.items():
            total[key] = total.get(key, 0.0) + square
    return total


def role_reward_sums(roles: Sequence[str], episodes, *, role_rewards, device: torch.device) -> torch.Tensor:
    """`[R, 2]` per role: sum and count of the per-role rewards of this process's calls (None: not counted)."""
    sums = torch.zeros(len(roles), 2, device=device)
    for episode, rewards in zip(episodes, role_rewards):
        for call, reward in zip(episode.calls, rewards):
            if reward is not None:
                sums[roles.index(call.role)] += torch.tensor([reward, 1.0], device=device)
    return sums


def role_reward_metrics(roles: Sequence[str], sums: torch.Tensor) -> dict[str, float]:
    """`role/<role>/role_reward`: the mean per-role reward of each role that has one."""
    return {f"role/{role}/role_reward": total / count for role, (total, count) in zip(roles, sums.tolist()) if count}


def tool_sums(roles: Sequence[str], episodes, device: torch.device) -> torch.Tensor:
    """`[R, 4]` per role of ``roles`` (the roles with tools) over this process's episodes: `generate` calls (tool
    loops), model calls, tool calls, failed tool calls."""
    sums = torch.zeros(len(roles), 4, device=device)
    for call in (c for e in episodes for c in e.calls if c.role in roles):
        sums[roles.index(call.role)] += torch.tensor(
            [float(call.turn == 0), 1.0, call.tool_calls, call.tool_errors], device=device
        )
    return sums


def tool_metrics(roles: Sequence[str], sums: torch.Tensor, num_episodes: int) -> dict[str, float]:
    """Per role with tools and calls: `role/<role>/tool_calls` and `tool_errors` (per `generate`) and
    `turns_per_call` (model calls per `generate`); over every role, TRL's `tools/call_frequency` (tool calls per
    episode) and `tools/failure_frequency` (the failed share of tool calls)."""
    metrics = {}
    for role, (loops, calls, tool_calls, errors) in zip(roles, sums.tolist()):
        if loops:
            metrics[f"role/{role}/tool_calls"] = tool_calls / loops
            metrics[f"role/{role}/tool_errors"] = errors / loops
            metrics[f"role/{role}/turns_per_call"] = calls / loops
    tool_calls, errors = sums[:, 2].sum().item(), sums[:, 3].sum().item()
    metrics["tools/call_frequency"] = tool_calls / num_episodes if num_episodes else 0.0
    metrics["tools/failure_frequency"] = errors / tool_calls if tool_calls else 0.0
    return metrics
