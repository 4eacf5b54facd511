"""Gradient coherence damping per role: shrink an update that keeps pointing where the recent ones pointed.

scale = 1 - lambda * max(0, cos(g, EMA(g))), applied to the role adapter's gradient before clipping and the optimizer
step. Same-role instances pushing one adapter in one direction step after step is the isolated policy's gradient
amplification; damping the coherent part slows it without touching updates that change direction.
"""

from __future__ import annotations

import torch


class CoherenceDamping:
    """Per-adapter EMA of the gradient and the damping of the next one."""

    def __init__(self, lambdas: dict[str, float], windows: dict[str, int]):
        for adapter, value in lambdas.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Coherence lambda of {adapter!r} must be in [0, 1] (<= 0.3 advised), got {value}.")
        self.lambdas = dict(lambdas)
        self.decay = {a: 1.0 - 2.0 / (windows[a] + 1) for a in lambdas}  # EMA over about `window` steps
        self.ema: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def apply(self, adapter: str, grads: list[torch.Tensor]) -> tuple[float, float]:
        """Scale ``grads`` in place; returns (cosine to the EMA before this step, scale applied)."""
        flat = torch.cat([g.detach().float().flatten() for g in grads])
        ema = self.ema.get(adapter)
        cosine = 0.0 if ema is None else float(torch.nn.functional.cosine_similarity(flat, ema, dim=0))
        scale = 1.0 - self.lambdas[adapter] * max(0.0, cosine)
        decay = self.decay[adapter]
        self.ema[adapter] = flat.clone() if ema is None else decay * ema + (1.0 - decay) * flat
        for g in grads:
            g.mul_(scale)
        return cosine, scale

    def state_dict(self) -> dict:
        return {"ema": {a: t.cpu() for a, t in self.ema.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.ema = dict(state["ema"])
