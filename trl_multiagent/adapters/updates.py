"""``AdapterUpdates``: how the role adapters of a run are updated, as four parts built together from a config.

Each part reads the adapters installed on their bases (``InstalledAdapters``, installed.py) and does one thing; the
trainer holds each and calls it by name:

1. routing (``SampleRouting``, sample_routing.py): the adapter or shadow of every sample of a forward, what a forward
   must not mix, the base model it calls;
2. the optimizer (``AdapterOptimizer``, optimizer.py): one optimizer and schedule stepping every adapter, one
   adapter alone before a mini-batch's step, the shadows after each step; under DeepSpeed through param groups per
   adapter (``AdapterGroups``, deepspeed_groups.py);
3. process alignment (``ProcessAlignment``, process_alignment.py): the forwards and gradients several processes must
   keep alike under DDP and DeepSpeed;
4. gradient accounts (``GradientAccounts``, gradient_accounts.py): each adapter's gradient measured, merged from the
   role shadows, damped and clipped before the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..seams.trl import disable_dropout_in_model
from .bases import Bases
from .deepspeed_groups import adapter_groups_for
from .gradient_accounts import GradientAccounts
from .installed import InstalledAdapters
from .optimizer import AdapterOptimizer
from .process_alignment import ProcessAlignment
from .sample_routing import SampleRouting


@dataclass(frozen=True)
class AdapterUpdates:
    """The adapters of a run and the four parts of their update (module docstring)."""

    installed: InstalledAdapters
    routing: SampleRouting
    optimizer: AdapterOptimizer
    alignment: ProcessAlignment
    accounts: GradientAccounts

    @classmethod
    def from_config(
        cls, peft_model, args, *, bases: Bases, measure_gradients: bool, accelerator=None, decay_parameter_names=None
    ) -> AdapterUpdates:
        """The adapters and update a ``MultiAgentGRPOConfig`` asks for, one adapter per adapter name of ``bases``,
        installed on ``peft_model`` (the trainer's) and the extra bases; ``accelerator``'s processes aligned.
        ``measure_gradients``: False where the gradients are not in ``.grad`` (DeepSpeed partitions them).
        ``decay_parameter_names(model)``: the Trainer's, the parameters it gives weight decay (under DeepSpeed, an
        adapter clipped on its own in the engine's step must have all or none of them)."""
        installed = InstalledAdapters(
            peft_model, bases.role_adapters, bases=bases, role_shadows=args.monitor_role_grad_norms
        )
        if args.disable_dropout:  # TRL disabled it before the role adapters (and the other bases) existed
            for model in installed.models.values():
                disable_dropout_in_model(model)
        alignment = ProcessAlignment.for_processes(installed, accelerator)
        routing = SampleRouting(
            installed,
            bases=bases,
            mix_adapters_in_forward=args.mix_adapters_in_forward,
            one_adapter_per_forward=alignment.aligns_forwards,  # `same_forwards` arranges forwards by adapter
        )
        accounts = GradientAccounts(
            installed,
            coherence_lambda=args.role_coherence_lambda,
            coherence_window=args.role_coherence_window,
            measure_gradients=measure_gradients,
        )
        groups = None
        if accelerator is not None:

            def sum_over_processes(tensor):  # a partition's squares, which may sit on the CPU (optimizer offload)
                return accelerator.reduce(tensor.to(accelerator.device), reduction="sum").to(tensor.device)

            groups = adapter_groups_for(
                args,
                installed,
                deepspeed_plugin=accelerator.state.deepspeed_plugin,
                sum_over_processes=sum_over_processes,
                decay_parameter_names=decay_parameter_names,
            )
        optimizer = AdapterOptimizer(installed, lr_per_update=args.lr_scheduler_steps == "per_update", groups=groups)
        return cls(installed=installed, routing=routing, optimizer=optimizer, alignment=alignment, accounts=accounts)
