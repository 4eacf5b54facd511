"""``GradientAccounts``: each adapter's gradient once a step's backward passes are done, before the optimizer step.

In order: each role's shadow gradient is measured and merged back into its shared adapter (so the update is the one a
plain step would apply); each adapter's gradient is measured; coherence damping scales it (``CoherenceDamping``).
Clipping per adapter (``clip``) comes after. A training step takes one optimizer update under
``update_schedule="merged"`` and one per mini-batch under ``"mini_batches"``: what each update measured
(``GradientNorms``) is kept until the step ends, when the trainer takes them all (``step_measured``) and monitoring
turns them into the step's metrics. Everything here reads gradients in ``.grad``, which DeepSpeed partitions away:
under it only the shadows' merge runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .coherence import CoherenceDamping
from .installed import InstalledAdapters


@dataclass(frozen=True)
class GradientNorms:
    """What one optimizer update's gradients measured before clipping (``monitoring.role_metrics.update_metrics``
    turns a training step's updates into the ``adapter/`` and ``role/`` metrics)."""

    adapter_squares: dict[str, float]  # adapter -> squared norm of its gradient
    role_squares: dict[str, float]  # role of a shared adapter -> squared norm of its shadow's gradient
    coherence: dict[str, tuple[float, float]]  # adapter -> (cosine, scale) of its coherence damping, when damped


class GradientAccounts:
    """Measures, merges, damps and clips the gradients of the adapters of ``installed``.

    Args:
        installed: the run's adapters and shadows.
        coherence_lambda, coherence_window: per-role coherence damping (``role_coherence_lambda``).
        measure_gradients: False where the gradients are not in ``.grad`` (DeepSpeed partitions them).
    """

    def __init__(
        self,
        installed: InstalledAdapters,
        *,
        coherence_lambda: dict[str, float] | None = None,
        coherence_window: int = 10,
        measure_gradients: bool = True,
    ):
        self.installed = installed
        self.measure_gradients = measure_gradients
        self.coherence = self._coherence(coherence_lambda or {}, coherence_window)
        self._measured: list[GradientNorms] = []  # the updates of the training step under way

    def _coherence(self, role_lambdas: dict[str, float], window: int) -> CoherenceDamping | None:
        if not role_lambdas:
            return None
        if not self.measure_gradients:
            raise ValueError("`role_coherence_lambda` needs gradients in `.grad`; DeepSpeed partitions them away.")
        lambdas: dict[str, float] = {}
        for role, value in role_lambdas.items():
            adapter = self.installed.role_adapters[role]
            if lambdas.setdefault(adapter, float(value)) != float(value):
                raise ValueError(f"Roles sharing adapter {adapter!r} were given different coherence lambdas.")
        return CoherenceDamping(lambdas, dict.fromkeys(lambdas, window))

    def before_optimizer_step(self) -> None:
        """Complete each adapter's gradient, measure it (kept for ``step_measured``, unless the gradients are not in
        ``.grad``), damp it."""
        role_squares = {}
        for split in self.installed.role_splits:
            role_squares.update(split.role_squares())
            split.merge()
        if not self.measure_gradients:
            return
        adapter_squares = self._adapter_squares()
        coherence = {}
        if self.coherence is not None:
            for adapter in self.coherence.lambdas:
                grads = [p.grad for p in self.installed.parameters(adapter).values() if p.grad is not None]
                if grads:
                    coherence[adapter] = self.coherence.apply(adapter, grads)
        self._measured.append(GradientNorms(adapter_squares, role_squares, coherence))

    def step_measured(self) -> list[GradientNorms]:
        """What each optimizer update of the training step measured, in order (empty where nothing was measured);
        the next call starts from the next step's."""
        measured, self._measured = self._measured, []
        return measured

    def clip(self, max_norm: float) -> torch.Tensor:
        """Clip each adapter's gradient to ``max_norm`` on its own; returns the norm over all of them."""
        norms = []
        for adapter in self.installed.adapter_names:
            params = [p for p in self.installed.parameters(adapter).values() if p.grad is not None]
            if params:
                norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return torch.stack(norms).norm() if norms else torch.tensor(0.0)

    def norm(self) -> torch.Tensor:
        """The norm over every adapter's gradient, as ``clip`` returns it, without clipping."""
        grads = [p.grad for a in self.installed.adapter_names for p in self.installed.parameters(a).values()]
        grads = [g for g in grads if g is not None]
        return torch.nn.utils.get_total_norm(grads) if grads else torch.tensor(0.0)

    def _adapter_squares(self) -> dict[str, float]:
        squares = {}
        for adapter in self.installed.adapter_names:
            grads = [p.grad for p in self.installed.parameters(adapter).values() if p.grad is not None]
            squares[adapter] = float(sum(g.float().pow(2).sum() for g in grads)) if grads else 0.0
        return squares

    def state_dict(self) -> dict | None:
        """What a checkpoint keeps: the coherence damping's running directions (None without damping)."""
        return self.coherence.state_dict() if self.coherence is not None else None

    def load_state_dict(self, state: dict) -> None:
        if self.coherence is not None:
            self.coherence.load_state_dict(state)
