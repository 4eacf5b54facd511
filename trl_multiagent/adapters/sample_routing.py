"""``SampleRouting``: which adapter (or shadow) every sample of a forward goes through, what one forward must not mix,
and which base model (and router) a forward calls."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..seams.deepspeed import call_through_engine
from .bases import Bases
from .installed import InstalledAdapters
from .routing import AdapterRouter


class SampleRouting:
    """Routes the samples of the trainer's forwards to the adapters installed in ``installed``.

    Args:
        installed: the run's adapters, their bases and routers.
        bases: the base models (``Bases``), to call a held extra base through the DeepSpeed engine holding it.
        mix_adapters_in_forward: let one forward mix adapters (where LoRA can: not on MoE weights).
        one_adapter_per_forward: every forward holds one adapter (DeepSpeed with several processes, whose forwards
            ``ProcessAlignment.same_forwards`` arranges alike on every process).
    """

    def __init__(
        self,
        installed: InstalledAdapters,
        *,
        bases: Bases | None = None,
        mix_adapters_in_forward: bool = False,
        one_adapter_per_forward: bool = False,
    ):
        self.installed = installed
        self.held = bases if bases is not None and bases.extra else None  # under DeepSpeed, the engine holds them
        self.mix_in_forward = mix_adapters_in_forward and installed.mixes_adapters and not one_adapter_per_forward

    def names(self, adapters: Sequence[str], roles: Sequence[str], training: bool) -> list[str]:
        """The adapter (or shadow) every sample of a micro-batch goes through: training routes each role of a shared
        adapter to its shadow, where gradients are measured per role."""
        names = list(adapters)
        if training:
            for split in self.installed.role_splits:  # each base's split reroutes its own shared adapters only
                names = split.routing(names, roles)
        return names

    def forward_keys(self, adapters: Sequence[str]) -> list[str] | None:
        """What a forward must not mix (None: nothing): adapters, unless ``mix_adapters_in_forward`` (on a 3-adapter
        Orch-Workers step, PEFT's mixed-batch path cost 1.2-1.3x the time of one adapter, splitting ~0.8-1.0x:
        benchmarks/sharing_cost.py) and LoRA can mix them in one batch (not on MoE weights); else base models where
        roles sit on several (adapter names are unique across bases, so splitting by adapter splits by base)."""
        if not self.mix_in_forward:
            return list(adapters)
        installed = self.installed
        return [str(installed.base_of[a]) for a in adapters] if len(installed.models) > 1 else None

    def forward_target(self, adapters: Sequence[str], main_model) -> tuple[torch.nn.Module, AdapterRouter]:
        """The model (``main_model``, as the caller holds it, for the trainer's base) and router of the one base the
        samples of ``adapters`` sit on; an extra base follows ``main_model``'s train/eval mode, and is called through
        ``main_model`` when that is the DeepSpeed engine holding it (``Bases.hold_in``)."""
        installed = self.installed
        bases = {installed.base_of[a] for a in adapters}
        if len(bases) != 1:
            raise ValueError(f"A forward mixes samples of base models {sorted(map(str, bases))}; split it by base.")
        base = bases.pop()
        if base == installed.main_base:
            return main_model, installed.routers[base]
        installed.models[base].train(main_model.training)
        if main_model is not installed.model and self.held is not None and self.held.holds(main_model):
            return call_through_engine(main_model, installed.models[base]), installed.routers[base]
        return installed.models[base], installed.routers[base]
