"""Gradient coherence damping per role: shrink an update that keeps pointing where the recent ones pointed.

scale = 1 - lambda * clamp(cos(g, EMA), 0, 1), applied to the role adapter's gradient before clipping and the
optimizer step. Same-role instances pushing one adapter in one direction step after step is the isolated policy's
gradient amplification; damping the coherent part slows it without touching updates that change direction.

As the reference stack does it: the EMA starts as a copy of the first gradient (so the first step has cosine 1 and is
damped by 1 - lambda), decays by 1 - 1/window per step, and moves toward the *damped* gradient (toward the undamped
one it would reinforce itself); the cosine is g.EMA / (|g| |EMA| + 1e-8), one scalar over the adapter's parameters.
"""

from __future__ import annotations

import torch

COSINE_EPS = 1e-8


class CoherenceDamping:
    """Per-adapter EMA of the damped gradient and the damping of the next one."""

    def __init__(self, lambdas: dict[str, float], windows: dict[str, int]):
        for adapter, value in lambdas.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Coherence lambda of {adapter!r} must be in [0, 1] (<= 0.3 advised), got {value}.")
        self.lambdas = dict(lambdas)
        self.decay = {a: 1.0 - 1.0 / windows[a] for a in lambdas}
        self.ema: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def apply(self, adapter: str, grads: list[torch.Tensor]) -> tuple[float, float]:
        """Scale ``grads`` in place; returns (cosine to the EMA before this step, scale applied)."""
        flat = torch.cat([g.detach().float().flatten() for g in grads])
        ema = self.ema.setdefault(adapter, flat.clone()).to(flat.device)  # first step: the gradient itself
        cosine = float(flat @ ema / (flat.norm() * ema.norm() + COSINE_EPS))
        scale = 1.0 - self.lambdas[adapter] * min(max(cosine, 0.0), 1.0)
        for g in grads:
            g.mul_(scale)
        decay = self.decay[adapter]
        self.ema[adapter] = decay * ema + (1.0 - decay) * scale * flat  # toward the damped gradient
        return cosine, scale

    def state_dict(self) -> dict:
        return {"ema": {a: t.cpu() for a, t in self.ema.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.ema = dict(state["ema"])
