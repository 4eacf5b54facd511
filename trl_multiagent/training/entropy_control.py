"""TRL's entropy bonus and its adaptive entropy control, per role.

GRPOTrainer (TRL 1.16) subtracts ``entropy_coef`` times the mean per-token entropy from its loss. With
``use_adaptive_entropy`` (Skywork-OR1's control) the coefficient starts at ``entropy_coef`` and moves once per
optimizer step: up by ``entropy_coef_delta`` (at most ``entropy_coef_max``) when the step's entropy was at or below
``entropy_target``, down (at least ``entropy_coef_min``) otherwise; it applies only while the last step's entropy
was at or below the target, so no bonus before the first measurement. Here every role type has its own coefficient
(``role_entropy_coef``) and, adaptive, its own target (``role_entropy_target``) and controller, measured on its own
tokens: roles' entropies differ by an order of magnitude, so one target would hold one role and never reach another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from ..seams.trl import entropy_bonus_like_trl
from .batch import TrainingBatch
from .loss_weights import LossScale


@dataclass
class RoleEntropy:
    """One role's controller: its coefficient now and the entropy of the last optimizer step (inf before one)."""

    coef: float
    target: float
    last_entropy: float = math.inf


class RoleEntropyControl:
    """Each role's entropy coefficient, and under ``adaptive`` its controller, as TRL's trainer keeps its one."""

    def __init__(
        self,
        roles: Sequence[str],
        *,
        coef: dict[str, float],
        target: dict[str, float],
        adaptive: bool,
        coef_min: float,
        coef_max: float,
        coef_delta: float,
        loss_weights: dict[str, float],
    ):
        self.adaptive = adaptive
        self.roles = {role: RoleEntropy(coef=coef[role], target=target[role]) for role in roles}
        self.bounds, self.delta = (coef_min, coef_max), coef_delta
        self.loss_weights = loss_weights  # a role's loss weight scales its bonus too: weight 0 still freezes a role
        # Each role's entropy sum and token count over this optimizer step's training forwards (None: none yet).
        self.window: dict[str, torch.Tensor | None] = dict.fromkeys(roles)

    @classmethod
    def from_config(cls, args, roles: Sequence[str]) -> RoleEntropyControl:
        coef, target = args.role_entropy_coef or {}, args.role_entropy_target or {}
        return cls(
            roles,
            coef={role: float(coef.get(role, args.entropy_coef)) for role in roles},
            target={role: float(target.get(role, args.entropy_target)) for role in roles},
            adaptive=args.use_adaptive_entropy,
            coef_min=args.entropy_coef_min,
            coef_max=args.entropy_coef_max,
            coef_delta=args.entropy_coef_delta,
            loss_weights=dict(args.role_loss_weights or {}),
        )

    @property
    def active(self) -> bool:
        """Whether any loss gets a bonus: a coefficient not 0, or adaptive control (which may raise one from 0)."""
        return self.adaptive or any(state.coef != 0.0 for state in self.roles.values())

    def applied(self, role: str) -> float:
        """The coefficient ``role``'s tokens get in this optimizer step (TRL's gate: adaptive control applies it only
        while the last step's entropy was at or below the target)."""
        state = self.roles[role]
        if self.adaptive and not state.last_entropy <= state.target:
            return 0.0
        return state.coef * float(self.loss_weights.get(role, 1.0))

    def coefficients(self, roles: Sequence[str], device: torch.device) -> torch.Tensor:
        """`[N]` the coefficient of each sample, by its role."""
        return torch.tensor([self.applied(role) for role in roles], device=device)

    def observe(self, roles: Sequence[str], entropies: torch.Tensor, kept: torch.Tensor) -> None:
        """Add a training forward's `[N, C]` entropies on its ``kept`` tokens to each role's window (kept on the
        device: no sync until the step ends)."""
        if not self.adaptive:
            return
        summed = (entropies.detach() * kept).sum(dim=1).double()
        counted = kept.sum(dim=1).double()
        for role in dict.fromkeys(roles):
            rows = torch.tensor([r == role for r in roles], device=entropies.device)
            stats = torch.stack([summed[rows].sum(), counted[rows].sum()])
            self.window[role] = stats if self.window[role] is None else self.window[role] + stats

    def bonus(self, entropies: torch.Tensor, batch: TrainingBatch, *, kept: torch.Tensor, scale: LossScale):
        """The bonus TRL's loss subtracts, each sample at its role's coefficient, over the ``kept`` tokens (TRL's
        high-entropy tokens under ``top_entropy_quantile``, else every completion token); a training forward's
        entropies go into the step's measurement first."""
        if scale.training:
            self.observe(batch.roles, entropies, kept)
        coefficients, mask = self.coefficients(batch.roles, entropies.device), batch.completion_mask
        return entropy_bonus_like_trl(
            entropies, mask, kept, coefficients, scale=scale, num_items_in_batch=batch.num_items_in_batch
        )

    def end_step(self, sum_over_processes: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> None:
        """At the end of an optimizer step: each role's entropy over every process's tokens of the step, and its
        coefficient moved by TRL's rule. A role with no token in the step keeps its state (no measurement)."""
        if not self.adaptive:
            return
        names = list(self.roles)
        zero = torch.zeros(2, device=device, dtype=torch.float64)
        totals = sum_over_processes(
            torch.stack([self.window[r] if self.window[r] is not None else zero for r in names])
        )
        self.window = dict.fromkeys(names)
        low, high = self.bounds
        for role, (total, count) in zip(names, totals.tolist(), strict=True):
            if count == 0:
                continue
            state = self.roles[role]
            state.last_entropy = total / count
            if state.last_entropy <= state.target:
                state.coef = min(state.coef + self.delta, high)
            else:
                state.coef = max(state.coef - self.delta, low)

    def metrics(self) -> dict[str, float]:
        return {f"role/{role}/entropy_coef": state.coef for role, state in self.roles.items()}

    def state_dict(self) -> dict[str, dict[str, float]]:
        return {role: {"entropy_coef": s.coef, "last_entropy": s.last_entropy} for role, s in self.roles.items()}

    def load_state_dict(self, state: dict[str, dict[str, float]]) -> None:
        for role, saved in state.items():
            if role in self.roles:
                self.roles[role].coef, self.roles[role].last_entropy = saved["entropy_coef"], saved["last_entropy"]


class EntropyStepCallback(TrainerCallback):
    """At the end of every training step, after its optimizer updates and before its log: each role's coefficient
    moved by the step's entropy over every process (``accelerator``'s sum), and recorded (``record(mode, values)``,
    the trainer's metric store)."""

    def __init__(self, control: RoleEntropyControl, accelerator, *, record: Callable[[str, dict[str, float]], None]):
        self.control, self.accelerator, self.record = control, accelerator, record

    def on_step_end(self, args, state, control, **kwargs):
        sum_over_processes = lambda t: self.accelerator.reduce(t, reduction="sum")  # noqa: E731
        self.control.end_step(sum_over_processes, self.accelerator.device)
        self.record("train", self.control.metrics())
