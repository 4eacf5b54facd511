"""``AdapterSteps``: the optimizer steps of one training step over the role adapters, and the norm the step logs.

The Trainer steps its optimizer once per training step and logs the gradient norm before clipping (``grad_norm``).
Over role adapters that step needs more: the gradients every process holds of the other bases averaged, and each
adapter's gradient measured (``GradientAccounts``) before any step; clipping per adapter where the run asks
(``clip_grad_norm_per_adapter``, and every mini-batch of ``update_schedule="mini_batches"``, which moves one adapter
alone) or over every base's adapters together; under mini-batches an optimizer step of its own for each mini-batch
but the last, whose norms before clipping count in the step's ``grad_norm``, added in squares. Under DeepSpeed the
engine steps and clips (each adapter's param group on its own: deepspeed_groups.py); its norm is the one counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .updates import AdapterUpdates


class AdapterSteps:
    """The steps over ``updates``' adapters.

    Args:
        updates: the run's adapters and the parts of their update.
        args: the run's config, read when a step is taken: ``max_grad_norm`` (0: no clipping), and whether each
            adapter is clipped on its own (``clip_grad_norm_per_adapter``, or ``update_schedule="mini_batches"``)
            rather than every base's adapters together.
        engine_steps: DeepSpeed's engine takes the optimizer steps, clipped in its own step.
        clip_grad_norm: ``(parameters, max_norm) -> norm``, the accelerator's clipping (over processes).
    """

    def __init__(
        self,
        updates: AdapterUpdates,
        args,
        *,
        engine_steps: bool,
        clip_grad_norm: Callable[[list[torch.nn.Parameter], float], torch.Tensor],
    ):
        self.updates, self.args = updates, args
        self.engine_steps, self.clip_grad_norm = engine_steps, clip_grad_norm

    def prepare(self) -> None:
        """Before any optimizer step: the other bases' gradients averaged over processes (DDP averages the trainer's
        model's only), each adapter's gradient measured, merged from its role shadows, damped."""
        self.updates.alignment.average_extra_gradients()
        self.updates.accounts.before_optimizer_step()

    def clip(self, model: torch.nn.Module, clip_as_trainer: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Prepare and clip before the step's optimizer step; the norm before clipping. ``clip_as_trainer()``: the
        Trainer's own clipping of ``model`` (under DeepSpeed: the norm the engine clipped, having stepped already)."""
        self.prepare()
        if self.engine_steps:  # the engine clipped (or its optimizer's groups did: deepspeed_groups.py) and stepped
            return clip_as_trainer()
        if self.args.clip_grad_norm_per_adapter or self.args.update_schedule == "mini_batches":
            return self.updates.accounts.clip(self.args.max_grad_norm)
        extra = self.updates.installed.extra_parameters()
        if extra:  # the norm over every base's adapters
            return self.clip_grad_norm([*model.parameters(), *extra], self.args.max_grad_norm)
        return clip_as_trainer()

    def adapter_step(
        self, adapter: str, *, optimizer: torch.optim.Optimizer, clip: Callable[[], torch.Tensor]
    ) -> float:
        """The optimizer step of one mini-batch: ``adapter`` alone, clipped on its own; returns its norm before
        clipping, which counts in the training step's (`step_norm`). Under DeepSpeed the engine took that step at the
        mini-batch's last backward: its norm is the engine's, from ``clip()`` (the trainer's clipping hook)."""
        if self.engine_steps:
            return float(clip())
        self.prepare()
        self.updates.optimizer.keep_only(adapter)
        if self.args.max_grad_norm > 0:
            norm = self.updates.accounts.clip(self.args.max_grad_norm)
        else:
            norm = self.updates.accounts.norm()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def mini_batch_updates(
        self,
        plan: list[tuple[str, Any]],
        *,
        train: Callable[[Any], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        clip: Callable[[], torch.Tensor],
    ) -> tuple[list[torch.Tensor], list[float]]:
        """``update_schedule="mini_batches"``: each ``(adapter, samples)`` of ``plan`` in order, ``train(samples)``
        its forwards and backwards, then its adapter's own optimizer step (`adapter_step`) once the next one starts;
        the last mini-batch's step is the Trainer's own, after this returns, with that adapter's gradients alone.
        Returns each mini-batch's loss and the norms before clipping of the steps taken here."""
        losses, norms = [], []
        for k, (adapter, samples) in enumerate(plan):
            if k:
                norms.append(self.adapter_step(plan[k - 1][0], optimizer=optimizer, clip=clip))
            if self.engine_steps:  # the engine steps at this mini-batch's last backward: this adapter alone
                self.updates.optimizer.keep_only(adapter)
            losses.append(train(samples))
        self.updates.optimizer.keep_only(plan[-1][0])
        return losses, norms

    def unclipped_norm(self, model: torch.nn.Module) -> torch.Tensor | None:
        """Without clipping, the preparation `clip` makes, and the norm over every base's adapters when there are
        other bases (None: the Trainer's own norm of ``model`` serves)."""
        self.prepare()
        extra = self.updates.installed.extra_parameters()
        if extra:
            return self.clip_grad_norm([*model.parameters(), *extra], float("inf"))
        return None


def step_norm(last_norm, earlier_norms: list[float]):
    """The training step's `grad_norm` before clipping: ``last_norm`` (its last update's) with the norms of its
    earlier mini-batch updates added in squares (``last_norm`` itself when there were none)."""
    if not earlier_norms:
        return last_norm
    return math.sqrt(sum(n**2 for n in earlier_norms) + float(last_norm) ** 2)
