"""What the loss adds to TRL's, per role: the KL term toward the base model at each role's ``role_beta``, and TRL's
entropy bonus at each role's coefficient (entropy_control.py). TRL's loss has one coefficient of each for the whole
batch; here each sample's role sets its own, and the KL term is computed here because TRL's reference forward
(``disable_adapter``) would leave every adapter but the active one frozen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .batch import TrainingBatch
from .entropy_control import RoleEntropyControl
from .loss_weights import LossScale, per_role_kl_loss

# (entropies, mask, quantile) -> [N, C] the tokens at or above that quantile of entropy (TRL's get_high_entropy_mask)
HighEntropyMask = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


class RoleLossTerms:
    """The per-role terms of one loss forward, from the run's settings (``args``) for its ``roles``."""

    def __init__(
        self,
        args,
        roles: Sequence[str],
        *,
        high_entropy_mask: HighEntropyMask,
        record_kl: Callable[[str, TrainingBatch, torch.Tensor], None],
    ):
        """``record_kl(mode, batch, per_token_kl)``: each role's KL of the forward, into the step's metrics."""
        self.args, self.high_entropy_mask, self.record_kl = args, high_entropy_mask, record_kl
        self.entropy = RoleEntropyControl.from_config(args, roles)  # each role's coefficient, its adaptive control

    def added(
        self,
        loss: torch.Tensor,
        batch: TrainingBatch,
        per_token_logps: torch.Tensor,
        entropies: torch.Tensor,
        *,
        role_beta: dict[str, float],
        scale: Callable[[], LossScale],
    ) -> torch.Tensor:
        """TRL's ``loss`` of ``batch`` with the KL term (where the batch has the base model's log-probs) and minus
        the entropy bonus (where a role has one); ``per_token_logps``, ``entropies``: `[N, C]`, the forward's;
        ``scale()``: the reduction's scale now, read only where a term applies (it reads the Trainer's training
        state, which an evaluation before training has not set)."""
        if batch.ref_per_token_logps is not None:
            beta, now = torch.tensor([role_beta[r] for r in batch.roles], device=per_token_logps.device), scale()
            kl, per_token_kl = per_role_kl_loss(
                per_token_logps,
                batch,
                beta,
                loss_type=self.args.loss_type,
                scale=now,
                bias_correction=self.args.use_bias_correction_kl,
                importance_sampling_level=self.args.importance_sampling_level,
            )
            self.record_kl("train" if now.training else "eval", batch, per_token_kl)
            loss = loss + kl
        if self.entropy.active:  # on TRL's high-entropy tokens under `top_entropy_quantile`, as its loss
            kept, quantile = batch.completion_mask, self.args.top_entropy_quantile
            if quantile < 1.0:
                kept = kept * self.high_entropy_mask(entropies, kept, 1 - quantile)
            loss = loss - self.entropy.bonus(entropies, batch, kept=kept, scale=scale())
        return loss
