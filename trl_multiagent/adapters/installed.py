"""``InstalledAdapters``: the role adapters of a run on the base models they sit on, with their routers and shadows.

One PEFT model per base (the trainer's, and one per extra base of ``role_models``), each holding the adapters of its
roles and one ``AdapterRouter`` over its LoRA layers. Shadows are extra adapters that only carry gradients: one per
role of a shared adapter (``RoleGradientSplit``, for ``monitor_role_grad_norms``); they are never optimised or saved.

The parts of an adapter update (``updates.py``) all read what is installed here.
"""

from __future__ import annotations

import torch

from .bases import Bases
from .role_gradients import RoleGradientSplit
from .routing import AdapterRouter, adapter_parameters, install_role_adapters, set_adapters_trainable, unique_adapters


class InstalledAdapters:
    """Installs one adapter per name of ``role_adapters`` on the PEFT model of its base.

    Args:
        peft_model: the trainer's PEFT model with its ``default`` adapter (replaced by the role adapters).
        role_adapters: role type -> adapter name.
        bases: the base models the roles sit on (``Bases``; None: all on ``peft_model``): each extra base's adapters
            are installed on its own PEFT model, routed by its own router.
        role_shadows: give each role of a shared adapter a shadow, so its share of the gradient can be measured.
    """

    def __init__(self, peft_model, role_adapters: dict[str, str], *, bases: Bases | None = None, role_shadows=False):
        self.model = peft_model
        self.role_adapters = dict(role_adapters)
        self.adapter_names = unique_adapters(self.role_adapters)
        self._params: dict[str, dict[str, torch.nn.Parameter]] = {}  # each adapter's LoRA weights, found once
        bases = bases if bases is not None else Bases.one(self.role_adapters)
        self.main_base = bases.main
        self.models = {bases.main: peft_model, **{n: b.model for n, b in bases.extra.items()}}
        self.base_of = {a: bases.base_of(a) for a in self.adapter_names}
        for base, model in self.models.items():
            install_role_adapters(model, [a for a in self.adapter_names if self.base_of[a] == base])
        self.routers = {base: AdapterRouter(model) for base, model in self.models.items()}
        self.router = self.routers[bases.main]
        self.mixes_adapters = all(router.mixes_adapters for router in self.routers.values())
        self.role_splits: list[RoleGradientSplit] = []
        if role_shadows and not self.mixes_adapters:
            raise ValueError(
                "`monitor_role_grad_norms` routes each role of a shared adapter to its own shadow inside one batch, "
                "which LoRA on MoE expert weights cannot do. Turn it off, or leave the experts out of "
                "`target_modules`."
            )
        if role_shadows and len(self.adapter_names) < len(self.role_adapters):
            for base, model in self.models.items():
                roles = {r: a for r, a in self.role_adapters.items() if self.base_of[a] == base}
                if len(set(roles.values())) < len(roles):
                    self.role_splits.append(RoleGradientSplit(model, roles, unique_adapters(roles)))
        self.model_of = {a: self.models[self.base_of[a]] for a in self.adapter_names}
        self.model_of.update({s: split.model for split in self.role_splits for s in split.shadows})

    @property
    def shadows(self) -> list[str]:
        return [shadow for split in self.role_splits for shadow in split.shadows]

    def parameters(self, adapter: str) -> dict[str, torch.nn.Parameter]:
        """The LoRA parameters of ``adapter`` (or of a shadow), on its own base: looked up by name once (a scan of
        every parameter name, which per step and per adapter cost isolated policy ~4% of a tiny model's step)."""
        if adapter not in self._params:
            self._params[adapter] = adapter_parameters(self.model_of[adapter], adapter)
        return self._params[adapter]

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters of the bases other than the trainer's model (the optimizer adds them)."""
        return [p for model in list(self.models.values())[1:] for p in model.parameters() if p.requires_grad]

    def on_main_base(self, adapter: str) -> bool:
        return self.base_of[adapter] == self.main_base

    def by_base(self, main_model) -> dict:
        """Base name -> (its PEFT model, its adapters), ``main_model`` standing for the trainer's base."""
        models = {**self.models, self.main_base: main_model}
        return {
            base: (model, [a for a in self.adapter_names if self.base_of[a] == base]) for base, model in models.items()
        }

    def sync_shadows(self) -> None:
        """Every shadow takes its adapter's weights (after each optimizer step, and after a resume)."""
        for split in self.role_splits:
            split.sync_weights()

    def weights_loaded(self) -> None:
        """After the adapters' weights were replaced (resume): every shadow mirrors its adapter again."""
        self._params.clear()
        for model in self.models.values():
            set_adapters_trainable(model, [*self.adapter_names, *self.shadows])
        self.sync_shadows()
