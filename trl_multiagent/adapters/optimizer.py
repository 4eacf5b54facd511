"""``AdapterOptimizer``: the Trainer's one optimizer and learning-rate schedule, as every adapter's.

One optimizer steps every adapter of every base (the extra bases' parameters are added to it); before a step that
must move one adapter alone (a mini-batch of ``update_schedule="mini_batches"``) every other gradient is dropped;
after each step the shadows take the new weights; under ``lr_scheduler_steps="per_update"`` the schedule advances
once per adapter update call (``UpdateCallScheduler``). Under DeepSpeed, whose engine steps its own copies of the
parameters, one adapter steps alone, and each is clipped on its own, through param groups per adapter
(``AdapterGroups``, deepspeed_groups.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from .deepspeed_groups import ADAPTER_KEY, AdapterGroups, engine_clipping_off, group_by_adapter
from .installed import InstalledAdapters
from .per_update_lr import UpdateCallScheduler


class AdapterOptimizer:
    """How the optimizer and scheduler the Trainer builds step the adapters of ``installed``.

    Args:
        installed: the run's adapters, their bases and shadows.
        lr_per_update: step the learning-rate scheduler once per adapter update call (``lr_scheduler_steps``).
        groups: one param group per adapter and the hooks that step them (under DeepSpeed; None: the Trainer's
            groups, and gradients dropped from the parameters themselves).
    """

    def __init__(
        self, installed: InstalledAdapters, *, lr_per_update: bool = False, groups: AdapterGroups | None = None
    ):
        self.installed = installed
        self.lr_per_update, self.lr_calls = lr_per_update, None  # the scheduler wrapper, once `scheduled` made it
        self.groups = groups
        self._hooked = None  # the optimizer `attach` hooked

    def create(
        self,
        create_optimizer: Callable[[], torch.optim.Optimizer],
        *,
        weight_decay: float,
        decay_parameter_names: Callable,
        deepspeed_plugin=None,
    ) -> torch.optim.Optimizer:
        """The Trainer's optimizer (``create_optimizer()``) as every adapter's: made while the shadows are frozen,
        the extra bases' parameters added (`extend`), hooked (`attach`); with per-adapter param groups that clip
        themselves, the clipping of ``deepspeed_plugin``'s engine off."""
        with self.shadows_frozen():
            optimizer = create_optimizer()
            self.extend(optimizer, weight_decay, decay_parameter_names)
        self.attach(optimizer)
        if self.groups is not None and self.groups.clip_norm > 0:  # each adapter's group clips itself in the step
            engine_clipping_off(deepspeed_plugin)
        return optimizer

    @contextmanager
    def shadows_frozen(self) -> Iterator[None]:
        """While the optimizer is created: shadows carry gradients but are never optimised."""
        params = [p for s in self.installed.shadows for p in self.installed.parameters(s).values()]
        for param in params:
            param.requires_grad = False
        try:
            yield
        finally:
            for param in params:
                param.requires_grad = True

    def extend(self, optimizer, weight_decay: float, decay_parameter_names) -> None:
        """Add the extra bases' trainable parameters to ``optimizer`` (one optimizer steps every base), with the
        Trainer's weight-decay split (``decay_parameter_names(model)``); those already in it are left alone. With
        ``groups``, every group is then cut into one per adapter (``group_by_adapter``)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in list(self.installed.models.values())[1:]:
            decay = set(decay_parameter_names(model))
            params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in present]
            for wanted, rate in ((True, weight_decay), (False, 0.0)):
                group = [p for n, p in params if (n in decay) == wanted]
                if group:
                    optimizer.add_param_group({"params": group, "weight_decay": rate})
        if self.groups is not None and ADAPTER_KEY not in optimizer.param_groups[0]:
            adapters = self.installed.adapter_names
            group_by_adapter(optimizer, {p: a for a in adapters for p in self.installed.parameters(a).values()})

    def attach(self, optimizer) -> None:
        """Run ``after_step`` after every step of ``optimizer`` (the Trainer calls ``step()`` itself; under DeepSpeed
        the engine's ZeRO optimizer calls it), through torch's public step post-hook on the optimizer the Trainer
        built. A later ``train()`` asks again with the same optimizer, wrapped by then (accelerate's, DeepSpeed's:
        each holds the one it wraps as ``optimizer``): it is hooked once."""
        inner = optimizer
        while inner is not self._hooked and getattr(inner, "optimizer", None) is not None:
            inner = inner.optimizer
        if inner is not self._hooked:
            optimizer.register_step_post_hook(lambda _optimizer, _args, _kwargs: self.after_step())
            if self.groups is not None:
                self.groups.attach(optimizer)
            self._hooked = optimizer

    def after_step(self) -> None:
        """Shadows take the weights the step produced; the other bases' gradients are cleared (the Trainer zeroes its
        own model's only, and they would accumulate over steps)."""
        self.installed.sync_shadows()
        for param in self.installed.extra_parameters():
            param.grad = None

    def keep_only(self, adapter: str) -> None:
        """Drop every gradient but ``adapter``'s, so the next optimizer step moves that adapter alone (an optimizer
        skips parameters without gradient; a zero gradient would still move them through its momentum). Under
        DeepSpeed, called before the backward passes whose last one steps the engine: the optimizer's groups of the
        other adapters sit out its steps."""
        if self.lr_calls is not None:
            self.lr_calls.starts(adapter)
        if self.groups is not None:
            self.groups.alone = adapter
        keep = set(self.installed.parameters(adapter).values())
        for model in self.installed.models.values():
            for param in model.parameters():
                if param.grad is not None and param not in keep:
                    param.grad = None

    def scheduled(self, scheduler):
        """The Trainer's learning-rate scheduler as this run steps it: under ``lr_scheduler_steps="per_update"``
        once per adapter update call (``UpdateCallScheduler``), else as it is."""
        if not self.lr_per_update or isinstance(scheduler, UpdateCallScheduler):
            return scheduler
        self.lr_calls = UpdateCallScheduler(scheduler, len(self.installed.adapter_names))
        return self.lr_calls
