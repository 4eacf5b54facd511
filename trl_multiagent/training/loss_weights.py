"""Per-sample loss weights: role weights and balance, and exact normalisation over uneven micro-batches.

TRL folds every sample's weight into its loss through the aggregation of its ``loss_type``. Multiplying a sample's
advantage by a positive weight scales its policy-gradient term by exactly that weight for every TRL loss type (the
clipping and sign tests are invariant to positive scaling), so weights are applied to advantages; the KL term,
computed here, uses the same weights.
"""

from __future__ import annotations

from dataclasses import replace

import torch

# TRL's reduction of its loss by `loss_type` lives in the seam (seams/trl.py); training/'s modules import it from here.
from ..seams.trl import (
    GLOBAL_TOKEN_LOSSES,
    SEQUENCE_MEAN_LOSSES,
    TOKEN_MEAN_LOSSES,
    LossScale,
    aggregate_like_trl,
    check_loss_type,
)
from .batch import TrainingBatch

__all__ = [
    "GLOBAL_TOKEN_LOSSES",
    "SEQUENCE_MEAN_LOSSES",
    "TOKEN_MEAN_LOSSES",
    "LossScale",
    "chunk_correction",
    "generation_chunks",
    "importance_weights",
    "loss_ready",
    "per_role_kl_loss",
    "role_weights",
    "split_sizes",
]


def role_weights(
    roles: list[str],
    token_counts: torch.Tensor,
    *,
    role_loss_weights: dict[str, float],
    balance: str,
    loss_type: str,
) -> torch.Tensor:
    """`[N]` weight of each sample from its role (1.0 everywhere by default).

    With ``balance="per_role"`` each role type present gets an equal share of the loss: its samples (sequence-level
    loss types) or its tokens (token-level loss types) are rescaled so that every role's total equals
    total / number_of_roles. Role weights multiply on top.
    """
    check_loss_type(loss_type)  # a loss type not classified here would be balanced as if token-level
    weights = torch.tensor([float(role_loss_weights.get(r, 1.0)) for r in roles], device=token_counts.device)
    if balance == "per_role":
        size = torch.ones_like(weights) if loss_type in SEQUENCE_MEAN_LOSSES else token_counts.float()
        present = sorted(set(roles))
        role_size = {r: sum(size[i] for i, x in enumerate(roles) if x == r) for r in present}
        total = size.sum()
        balance_scale = torch.tensor(
            [float(total / (len(present) * role_size[r])) if role_size[r] > 0 else 0.0 for r in roles],
            device=weights.device,
        )
        weights = weights * balance_scale
    return weights


def split_sizes(num_samples: int, num_chunks: int) -> list[int]:
    """Near-equal micro-batch sizes that cover every sample (TRL's split drops the remainder)."""
    if num_samples < num_chunks:
        raise ValueError(
            f"A generation batch produced {num_samples} samples on this process, fewer than steps_per_generation="
            f"{num_chunks}. Raise per_device_train_batch_size or lower steps_per_generation."
        )
    base, extra = divmod(num_samples, num_chunks)
    return [base + (1 if i < extra else 0) for i in range(num_chunks)]


def chunk_correction(
    loss_type: str,
    *,
    chunk_samples: int,
    chunk_tokens: float,
    global_samples: int,
    global_tokens: float,
    num_processes: int,
    steps_per_generation: int,
) -> float:
    """Factor that makes TRL's per-micro-batch average weigh every sample as in one average over the whole batch.

    TRL averages each micro-batch on its own, and DDP averages processes, so with uneven micro-batches (a workflow
    makes a variable number of calls) a sample's weight would depend on the size of the micro-batch it landed in.
    """
    if loss_type in SEQUENCE_MEAN_LOSSES:
        return chunk_samples * num_processes * steps_per_generation / global_samples
    if loss_type in TOKEN_MEAN_LOSSES:
        return chunk_tokens * num_processes * steps_per_generation / max(global_tokens, 1.0)
    check_loss_type(loss_type)
    return 1.0  # GLOBAL_TOKEN_LOSSES: TRL divides by the generation batch's tokens, whatever the micro-batch


def generation_chunks(batch: TrainingBatch, *, steps: int, loss_type: str, num_processes: int) -> list[TrainingBatch]:
    """``steps`` near-equal chunks (one per micro-step of TRL's loop) covering every sample, each sample's weight
    corrected for its chunk."""
    token_counts = batch.completion_mask.sum(dim=1).float()
    chunks, begin = [], 0
    for size in split_sizes(len(batch), steps):
        rows = slice(begin, begin + size)
        begin += size
        correction = chunk_correction(
            loss_type,
            chunk_samples=size,
            chunk_tokens=token_counts[rows].sum().item(),
            global_samples=int(batch.num_samples_in_batch.item()),
            global_tokens=batch.num_items_in_batch.item(),
            num_processes=num_processes,
            steps_per_generation=steps,
        )
        chunk = batch.select(rows)
        chunks.append(replace(chunk, sample_weights=chunk.sample_weights * correction))
    return chunks


def fold_into_advantages(advantages: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """`[N, C]` (or `[N, 1]`) advantages that apply the importance-sampling ratio inside TRL's policy loss.

    TRL multiplies each token's policy loss by the ratio; every TRL policy loss except VESPO (which reads the ratio
    itself) is linear in the advantage for a non-negative factor, so scaling the advantage is the same product.
    """
    return advantages.unsqueeze(1) * ratio


def loss_ready(batch: TrainingBatch, loss_type: str) -> TrainingBatch:
    """The batch TRL's loss reads: each advantage times its sample weight and, for vLLM rollouts, the
    importance-sampling ratio folded in (VESPO reads the ratio itself)."""
    advantages = batch.advantages * batch.sample_weights
    ratio = batch.importance_sampling_ratio
    if ratio is not None and loss_type != "vespo":
        return replace(batch, advantages=fold_into_advantages(advantages, ratio), importance_sampling_ratio=None)
    return replace(batch, advantages=advantages)


def importance_weights(per_token_logps: torch.Tensor, batch: TrainingBatch, level: str) -> torch.Tensor:
    """TRL's ``coef_1``: the ratio of the policy now to the one that generated, per token (`[N, C]`) or per sequence
    (`[N, 1]`, the exp of the masked mean log-ratio) by ``importance_sampling_level``; 1 with gradient on-policy."""
    old = batch.old_per_token_logps
    log_ratio = per_token_logps - (per_token_logps.detach() if old is None else old)
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        mask = batch.completion_mask
        return torch.exp((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"`importance_sampling_level` must be 'token' or 'sequence', got {level!r}.")


def per_role_kl_loss(
    per_token_logps: torch.Tensor,
    batch: TrainingBatch,
    beta: torch.Tensor,
    *,
    loss_type: str,
    scale: LossScale,
    bias_correction: bool,
    importance_sampling_level: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The KL term toward the base model with each sample's own ``beta`` (`[N]`) and weight, reduced as TRL reduces
    its loss; also returns the detached `[N, C]` per-token KL that enters the loss (TRL's logged ``kl``).

    The per-token KL is the k3 estimator; with ``bias_correction`` (TRL's ``use_bias_correction_kl``) it is
    multiplied by the importance ratio (``importance_weights``), as TRL's loss does, since the samples came from the
    policy before this generation's updates.
    """
    # Zero where no completion token is: a row that trains nothing (training/even_forwards.py) has reference
    # log-probs of zero, and exp(0 - log p) of a padding token could overflow where it is masked anyway.
    delta = torch.where(batch.completion_mask.bool(), batch.ref_per_token_logps - per_token_logps, 0.0)
    per_token_kl = torch.exp(delta) - delta - 1
    if bias_correction:
        per_token_kl = per_token_kl * importance_weights(per_token_logps, batch, importance_sampling_level)
    weights = (beta * batch.sample_weights).unsqueeze(1)
    loss = aggregate_like_trl(
        per_token_kl * weights,
        batch.completion_mask,
        loss_type=loss_type,
        scale=scale,
        num_items_in_batch=batch.num_items_in_batch,
    )
    return loss, per_token_kl.detach()
