"""How far one training step's optimizer updates moved each role's policy, measured on the step's own samples.

The logged `role/<role>/policy_ratio` compares the policy in the loss's forward with the rollout policy, so it only
moves within a step: under `update_schedule="mini_batches"` a role with several mini-batches sees its own earlier
updates, under `"merged"` it is exactly 1. The size of the step's whole update, comparable under both schedules, is
the ratio the role's next forward on the same tokens would start from: the updated policy against the policy before
the step's first update, on every sampled token of the step. Pure arithmetic here; the trainer runs the forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import TrainerCallback

from .role_metrics import role_rows


def update_size_sums(
    roles: Sequence[str],
    sample_roles: Sequence[str],
    *,
    before: torch.Tensor,
    after: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """`[R, 3]` masked token sums per role of the ratio after / before, of (ratio - 1)^2, and the token count.

    ``before``, ``after``: `[N, C]` log-probs of each sample's completion tokens under its own adapter before the
    step's first update and after its last; ``mask``: `[N, C]` completion mask.
    """
    ratio = torch.exp(after.float() - before.float())
    per_token = torch.stack([ratio, (ratio - 1) ** 2, torch.ones_like(ratio)])
    rows = role_rows(roles, sample_roles, ratio.device)
    return torch.einsum("rn,knt,nt->rk", rows, per_token, mask.float())


def update_size_metrics(roles: Sequence[str], sums: torch.Tensor) -> dict[str, float]:
    """`role/<role>/update_ratio` and `role/<role>/update_chi_square` of each role with tokens, from `[R, 3]` sums
    (added up over processes)."""
    metrics = {}
    for role, (ratio, chi, tokens) in zip(roles, sums.tolist()):
        if tokens:
            metrics[f"role/{role}/update_ratio"] = ratio / tokens
            metrics[f"role/{role}/update_chi_square"] = chi / tokens
    return metrics


class UpdateSizeCallback(TrainerCallback):
    """Calls ``measure`` at the end of every training step: after the step's optimizer updates, before its log, so
    what ``measure`` records is logged with the step it measures."""

    def __init__(self, measure: Callable[[], None]) -> None:
        self.measure = measure

    def on_step_end(self, args, state, control, **kwargs):
        self.measure()
