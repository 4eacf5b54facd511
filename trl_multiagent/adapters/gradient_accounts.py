"""``GradientAccounts``: each adapter's gradient once a step's backward passes are done, before the optimizer step.

In order: each role's shadow gradient is measured and merged back into its shared adapter (so the update is the one a
plain step would apply); each adapter's gradient is measured; coherence damping scales it (``CoherenceDamping``);
what was measured goes back to the trainer (``GradientNorms``: monitoring turns it into metrics). Clipping per adapter
(``clip``) comes after. Everything here reads gradients in ``.grad``, which DeepSpeed partitions away: under it only
the shadows' merge runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .coherence import CoherenceDamping
from .installed import InstalledAdapters


@dataclass(frozen=True)
class GradientNorms:
    """What one optimizer step's gradients measured before clipping (``monitoring.role_metrics.update_metrics``
    turns it into the ``adapter/`` and ``role/`` metrics)."""

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

    def before_optimizer_step(self) -> GradientNorms | None:
        """Complete each adapter's gradient, measure it, damp it; returns what was measured (None where the gradients
        are not in ``.grad``)."""
        role_squares = {}
        for split in self.installed.role_splits:
            role_squares.update(split.role_squares())
            split.merge()
        if not self.measure_gradients:
            return None
        adapter_squares = self._adapter_squares()
        coherence = {}
        if self.coherence is not None:
            for adapter in self.coherence.lambdas:
                grads = [p.grad for p in self.installed.parameters(adapter).values() if p.grad is not None]
                if grads:
                    coherence[adapter] = self.coherence.apply(adapter, grads)
        return GradientNorms(adapter_squares, role_squares, coherence)

    def clip(self, max_norm: float) -> torch.Tensor:
        """Clip each adapter's gradient to ``max_norm`` on its own; returns the norm over all of them."""
        norms = []
        for adapter in self.installed.adapter_names:
            params = [p for p in self.installed.parameters(adapter).values() if p.grad is not None]
            if params:
                norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return torch.stack(norms).norm() if norms else torch.tensor(0.0)

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
