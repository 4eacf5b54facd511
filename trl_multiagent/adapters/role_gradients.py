"""Exact per-role gradient contributions under a shared adapter, for monitoring.

Under shared policy one adapter's gradient mixes every role's samples, and the research's "role capture" is about
how that gradient divides among roles. Each role of a shared adapter trains a shadow copy of it (routing sends the
role's samples there), so after backward each shadow holds exactly its role's contribution; before clipping the
shadows' gradients are summed back into the adapter, so the update itself is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .routing import paired_parameters, set_adapters_trainable


class RoleGradientSplit:
    def __init__(self, peft_model, role_adapters: dict[str, str], trainable: Sequence[str]):
        self.model = peft_model
        by_adapter: dict[str, list[str]] = {}
        for role, adapter in role_adapters.items():
            by_adapter.setdefault(adapter, []).append(role)
        self.split = {adapter: roles for adapter, roles in by_adapter.items() if len(roles) > 1}
        self.shadow_of = {role: f"{adapter}__role_{role}" for adapter, roles in self.split.items() for role in roles}
        with torch.random.fork_rng(devices=[]):  # shadow inits are overwritten; keep the run's RNG stream intact
            for role, shadow in self.shadow_of.items():
                peft_model.add_adapter(shadow, peft_model.peft_config[role_adapters[role]])
        set_adapters_trainable(peft_model, [*trainable, *self.shadow_of.values()])
        self._adapter_of = {role: role_adapters[role] for role in self.shadow_of}
        self.sync_weights()

    @property
    def shadows(self) -> list[str]:
        return list(self.shadow_of.values())

    def routing(self, adapters: Sequence[str], roles: Sequence[str]) -> list[str]:
        return [self.shadow_of[r] if a in self.split else a for a, r in zip(adapters, roles)]

    def _pairs(self, role: str):
        return paired_parameters(self.model, self._adapter_of[role], self.shadow_of[role])

    @torch.no_grad()
    def sync_weights(self) -> None:
        for role in self.shadow_of:
            for param, shadow in self._pairs(role):
                shadow.copy_(param)

    def role_squares(self) -> dict[str, float]:
        """Squared norm of each role's gradient contribution, before `merge`."""
        return {
            role: float(sum(s.grad.float().pow(2).sum() for _, s in self._pairs(role) if s.grad is not None))
            for role in self.shadow_of
        }

    @torch.no_grad()
    def merge(self) -> None:
        """Sum the roles' shadow gradients into their shared adapter: the gradient a plain step would apply."""
        for role in self.shadow_of:
            for param, shadow in self._pairs(role):
                if shadow.grad is None:
                    continue
                param.grad = shadow.grad.clone() if param.grad is None else param.grad + shadow.grad
                shadow.grad = None
