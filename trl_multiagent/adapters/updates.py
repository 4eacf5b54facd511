"""``AdapterUpdates``: the role adapters of a run and how each one is updated, behind four calls of the trainer.

1. ``routing(adapters, roles, training)``: the adapter of every sample of a micro-batch, for its forward (and
   the recomputation of checkpointed layers in backward); training routes to shadows where a schedule needs them;
2. ``before_optimizer_step()``: once the gradients are complete: per-role shadow gradients merged back, gradient
   norms measured, coherence damping applied; returns what it measured (``GradientNorms``: monitoring reads it);
3. ``clip(max_norm)``: per-adapter gradient clipping (``clip_grad_norm_per_adapter``), and ``keep_only(adapter)``
   before a step that updates one adapter (a mini-batch of ``update_schedule="mini_batches"``);
4. ``after_optimizer_step()``: shadows take the new weights (hooked into the optimizer's ``step``).

Shadows are extra adapters that only carry gradients: per role of a shared adapter (``RoleGradientSplit``, for
monitoring). They are never optimised or saved.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from accelerate.utils import DistributedType

from .bases import Bases
from .coherence import CoherenceDamping
from .lr_steps import UpdateCallScheduler
from .role_gradients import RoleGradientSplit
from .routing import AdapterRouter, adapter_parameters, install_role_adapters, set_adapters_trainable, unique_adapters


@dataclass(frozen=True)
class GradientNorms:
    """What one optimizer step's gradients measured before clipping (``monitoring.role_metrics.update_metrics``
    turns it into the ``adapter/`` and ``role/`` metrics)."""

    adapter_squares: dict[str, float]  # adapter -> squared norm of its gradient
    role_squares: dict[str, float]  # role of a shared adapter -> squared norm of its shadow's gradient
    coherence: dict[str, tuple[float, float]]  # adapter -> (cosine, scale) of its coherence damping, when damped


class AdapterUpdates:
    """Installs one adapter per name of ``role_adapters`` on ``peft_model`` and runs their update schedule.

    Args:
        peft_model: the PEFT model with its ``default`` adapter (replaced by the role adapters).
        role_adapters: role type -> adapter name.
        monitor_role_grad_norms: measure each role's gradient under a shared adapter through role shadows.
        coherence_lambda, coherence_window: per-role coherence damping (``role_coherence_lambda``).
        measure_gradients: False where the gradients are not in ``.grad`` (DeepSpeed partitions them).
        bases: the base models the roles sit on (``Bases``; None: all on ``peft_model``): each extra base's adapters
            are installed on its own PEFT model and routed by its own router.
        lr_per_update: step the learning-rate scheduler once per adapter update call (``lr_scheduler_steps``).
    """

    def __init__(
        self,
        peft_model,
        role_adapters: dict[str, str],
        *,
        monitor_role_grad_norms: bool = False,
        coherence_lambda: dict[str, float] | None = None,
        coherence_window: int = 10,
        measure_gradients: bool = True,
        bases: Bases | None = None,
        mix_adapters_in_forward: bool = False,
        lr_per_update: bool = False,
    ):
        self.model = peft_model
        self.role_adapters = dict(role_adapters)
        self.adapter_names = unique_adapters(self.role_adapters)
        self.measure_gradients = measure_gradients
        self._params: dict[str, dict[str, torch.nn.Parameter]] = {}  # each adapter's LoRA weights, found once
        # One PEFT model per base: the trainer's (main) and those of the extra bases, each with its adapters
        bases = bases if bases is not None else Bases.one(self.role_adapters)
        self.models = {bases.main: peft_model, **{n: b.model for n, b in bases.extra.items()}}
        self.base_of = {a: bases.base_of(a) for a in self.adapter_names}
        for base, model in self.models.items():
            install_role_adapters(model, [a for a in self.adapter_names if self.base_of[a] == base])
        self.routers = {base: AdapterRouter(model) for base, model in self.models.items()}
        self.router = self.routers[bases.main]
        self.mixes_adapters = all(router.mixes_adapters for router in self.routers.values())
        self.mix_in_forward = mix_adapters_in_forward and self.mixes_adapters
        self.role_splits: list[RoleGradientSplit] = []
        if monitor_role_grad_norms and not self.mixes_adapters:
            raise ValueError(
                "`monitor_role_grad_norms` routes each role of a shared adapter to its own shadow inside one batch, "
                "which LoRA on MoE expert weights cannot do. Turn it off, or leave the experts out of "
                "`target_modules`."
            )
        if monitor_role_grad_norms and len(self.adapter_names) < len(self.role_adapters):
            for base, model in self.models.items():
                roles = {r: a for r, a in self.role_adapters.items() if self.base_of[a] == base}
                if len(set(roles.values())) < len(roles):
                    self.role_splits.append(RoleGradientSplit(model, roles, unique_adapters(roles)))
        self.model_of = {a: self.models[self.base_of[a]] for a in self.adapter_names}
        self.model_of.update({s: split.model for split in self.role_splits for s in split.shadows})
        self.coherence = self._coherence(coherence_lambda or {}, coherence_window)
        self.average = None  # averages a tensor over processes when the other bases need it (DDP; `from_config`)
        self.held = bases if bases.extra else None  # under DeepSpeed, the trainer's engine holds the other bases
        self.most_over_processes = None  # elementwise max of a tensor over processes, under DeepSpeed (`from_config`)
        self.lr_per_update, self.lr_calls = lr_per_update, None  # the scheduler wrapper, once `scheduled` made it

    @classmethod
    def from_config(cls, peft_model, args, *, bases: Bases, measure_gradients: bool, accelerator=None):
        """The adapters and schedule a ``MultiAgentGRPOConfig`` asks for, one per adapter of ``bases``; with several
        processes (``accelerator``) the other bases' gradients are averaged over processes before each step, as DDP
        averages the trainer's (under DeepSpeed the engine holding every base reduces them, and the processes align
        their forwards: ``same_forwards``)."""
        updates = cls(
            peft_model,
            bases.role_adapters,
            monitor_role_grad_norms=args.monitor_role_grad_norms,
            coherence_lambda=args.role_coherence_lambda,
            coherence_window=args.role_coherence_window,
            measure_gradients=measure_gradients,
            bases=bases,
            mix_adapters_in_forward=args.mix_adapters_in_forward,
            lr_per_update=args.lr_scheduler_steps == "per_update",
        )
        if accelerator is None or accelerator.num_processes == 1:
            return updates
        if accelerator.distributed_type == DistributedType.DEEPSPEED:  # the one engine reduces every base's gradients
            updates.most_over_processes = lambda tensor: accelerator.gather(tensor[None]).max(dim=0).values
        elif len(updates.models) > 1:
            updates.average = lambda tensor: accelerator.reduce(tensor, reduction="mean")
        return updates

    # ----------------------------------------------------------------------------------------------------- setup
    def _coherence(self, role_lambdas: dict[str, float], window: int) -> CoherenceDamping | None:
        if not role_lambdas:
            return None
        if not self.measure_gradients:
            raise ValueError("`role_coherence_lambda` needs gradients in `.grad`; DeepSpeed partitions them away.")
        lambdas: dict[str, float] = {}
        for role, value in role_lambdas.items():
            adapter = self.role_adapters[role]
            if lambdas.setdefault(adapter, float(value)) != float(value):
                raise ValueError(f"Roles sharing adapter {adapter!r} were given different coherence lambdas.")
        return CoherenceDamping(lambdas, dict.fromkeys(lambdas, window))

    @property
    def shadows(self) -> list[str]:
        return [shadow for split in self.role_splits for shadow in split.shadows]

    def adapter_params(self, adapter: str) -> dict[str, torch.nn.Parameter]:
        """The LoRA parameters of ``adapter`` (or of a shadow), on its own base: looked up by name once (a scan of
        every parameter name, which per step and per adapter cost isolated policy ~4% of a tiny model's step)."""
        if adapter not in self._params:
            self._params[adapter] = adapter_parameters(self.model_of[adapter], adapter)
        return self._params[adapter]

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters of the bases other than the trainer's model (the optimizer adds them)."""
        return [p for model in list(self.models.values())[1:] for p in model.parameters() if p.requires_grad]

    # ----------------------------------------------------------------------------------- several base models
    def forward_keys(self, adapters: Sequence[str]) -> list[str] | None:
        """What a forward must not mix (None: nothing): adapters, unless ``mix_adapters_in_forward`` (on a 3-adapter
        Orch-Workers step, PEFT's mixed-batch path cost 1.2-1.3x the time of one adapter, splitting ~0.8-1.0x:
        benchmarks/sharing_cost.py) and LoRA can mix them in one batch (not on MoE weights); else base models where
        roles sit on several (adapter names are unique across bases, so splitting by adapter splits by base)."""
        if not self.mix_in_forward or self.most_over_processes is not None:  # `same_forwards` needs one adapter each
            return list(adapters)
        return [str(self.base_of[a]) for a in adapters] if len(self.models) > 1 else None

    def forward_target(self, adapters: Sequence[str], main_model) -> tuple[torch.nn.Module, AdapterRouter]:
        """The model (``main_model``, as the caller holds it, for the trainer's base) and router of the one base the
        samples of ``adapters`` sit on; an extra base follows ``main_model``'s train/eval mode, and is called through
        ``main_model`` when that is the DeepSpeed engine holding it (``Bases.through_engine``)."""
        bases = {self.base_of[a] for a in adapters}
        if len(bases) != 1:
            raise ValueError(f"A forward mixes samples of base models {sorted(map(str, bases))}; split it by base.")
        base = bases.pop()
        if base == next(iter(self.models)):
            return main_model, self.routers[base]
        self.models[base].train(main_model.training)
        if main_model is not self.model and self.held is not None and self.held.holds(main_model):
            return self.held.through_engine(main_model, self.models[base]), self.routers[base]
        return self.models[base], self.routers[base]

    def by_base(self, main_model) -> dict:
        """Base name -> (its PEFT model, its adapters), ``main_model`` standing for the trainer's base."""
        models = {**self.models, next(iter(self.models)): main_model}
        return {
            base: (model, [a for a in self.adapter_names if self.base_of[a] == base]) for base, model in models.items()
        }

    def extend_optimizer(self, optimizer, weight_decay: float, decay_parameter_names) -> None:
        """Add the extra bases' trainable parameters to ``optimizer`` (one optimizer steps every base), with the
        Trainer's weight-decay split (``decay_parameter_names(model)``); those already in it are left alone."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in list(self.models.values())[1:]:
            decay = set(decay_parameter_names(model))
            params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in present]
            for wanted, rate in ((True, weight_decay), (False, 0.0)):
                group = [p for n, p in params if (n in decay) == wanted]
                if group:
                    optimizer.add_param_group({"params": group, "weight_decay": rate})

    @contextmanager
    def shadows_frozen(self) -> Iterator[None]:
        """While the optimizer is created: shadows carry gradients but are never optimised."""
        params = [p for s in self.shadows for p in self.adapter_params(s).values()]
        for param in params:
            param.requires_grad = False
        try:
            yield
        finally:
            for param in params:
                param.requires_grad = True

    # ------------------------------------------------------------------------------------------- the four calls
    def routing(self, adapters: Sequence[str], roles: Sequence[str], training: bool) -> list[str]:
        """1. The adapter (or shadow) every sample of a micro-batch goes through."""
        names = list(adapters)
        if training:
            for split in self.role_splits:  # each base's split reroutes its own shared adapters only
                names = split.routing(names, roles)
        return names

    def before_optimizer_step(self) -> GradientNorms | None:
        """2. Complete each adapter's gradient, measure it, damp it; returns what was measured (None where the
        gradients are not in ``.grad``)."""
        if self.average is not None:
            self._average_extra_gradients()
        role_squares = {}
        for split in self.role_splits:
            role_squares.update(split.role_squares())
            split.merge()
        if not self.measure_gradients:
            return None
        adapter_squares = self._adapter_squares()
        coherence = {}
        if self.coherence is not None:
            for adapter in self.coherence.lambdas:
                grads = [p.grad for p in self.adapter_params(adapter).values() if p.grad is not None]
                if grads:
                    coherence[adapter] = self.coherence.apply(adapter, grads)
        return GradientNorms(adapter_squares, role_squares, coherence)

    def clip(self, max_norm: float) -> torch.Tensor:
        """3. Clip each adapter's gradient to ``max_norm`` on its own; returns the norm over all of them."""
        norms = []
        for adapter in self.adapter_names:
            params = [p for p in self.adapter_params(adapter).values() if p.grad is not None]
            if params:
                norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return torch.stack(norms).norm() if norms else torch.tensor(0.0)

    def keep_only(self, adapter: str) -> None:
        """3. Drop every gradient but ``adapter``'s, so the next optimizer step moves that adapter alone (an optimizer
        skips parameters without gradient; a zero gradient would still move them through its momentum)."""
        if self.lr_calls is not None:
            self.lr_calls.starts(adapter)
        keep = set(self.adapter_params(adapter).values())
        for model in self.models.values():
            for param in model.parameters():
                if param.grad is not None and param not in keep:
                    param.grad = None

    def after_optimizer_step(self) -> None:
        """4. Shadows take the weights the step produced; the other bases' gradients are cleared (the Trainer
        zeroes its own model's only, and they would accumulate over steps)."""
        for split in self.role_splits:
            split.sync_weights()
        for param in self.extra_parameters():
            param.grad = None

    def scheduled(self, scheduler):
        """The Trainer's learning-rate scheduler as this run steps it: under ``lr_scheduler_steps="per_update"``
        once per adapter update call (``UpdateCallScheduler``), else as it is."""
        if not self.lr_per_update or isinstance(scheduler, UpdateCallScheduler):
            return scheduler
        self.lr_calls = UpdateCallScheduler(scheduler, len(self.adapter_names))
        return self.lr_calls

    def attach(self, optimizer) -> None:
        """Make ``optimizer.step`` run call 4 (the Trainer calls ``optimizer.step()`` itself)."""
        single_step = optimizer.step

        def step(_optimizer, closure=None):
            single_step(closure)
            self.after_optimizer_step()

        # A bound method, as torch's LR schedulers expect: each `train()` builds a new one, which wraps `step` through
        # its `__func__` (a plain function there failed the second `train()` of a trainer).
        optimizer.step = types.MethodType(step, optimizer)

    # ---------------------------------------------------------------------- several base models, several processes
    def _average_extra_gradients(self) -> None:
        """DDP averages the trainer's model's gradients; the other bases' are averaged here, in one collective. A
        parameter without gradient on every process keeps none (a zero gradient would still move it through Adam)."""
        params = self.extra_parameters()
        present = self.average(torch.tensor([float(p.grad is not None) for p in params], device=params[0].device))
        flat = self.average(
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        )
        for param, chunk, has in zip(params, flat.split([p.numel() for p in params]), present.tolist()):
            param.grad = chunk.view_as(param).clone() if has > 0 else None

    def synchronised_last(self, parts: list, pad_token_id: int) -> list:
        """The forwards of one micro-step, the trainer's base last (DDP synchronises its gradients on the last
        backward of a micro-step, on every process alike): with several processes and bases, a process whose
        micro-step holds none of the trainer's base's samples ends with a stand-in that trains nothing, one
        ``pad_token_id`` sample of the trainer's base with no completion token, so no process waits on it."""
        if self.average is None:
            return parts
        main = next(iter(self.models))
        on_main = [p for p in parts if self.base_of[p.adapters[0]] == main]
        if not on_main:
            on_main = [
                self.stand_in(parts[0], next(a for a in self.adapter_names if self.base_of[a] == main), pad_token_id)
            ]
        return [p for p in parts if self.base_of[p.adapters[0]] != main] + on_main

    def same_forwards(self, parts: list, pad_token_id: int) -> list:
        """The forwards of one micro-step (one adapter each) as DeepSpeed needs them to train as DDP does.

        With several processes, alike on every process: ZeRO-2 reduces the gradients of a part's adapter during its
        backward and ZeRO-3 gathers its weights during its forward, so every process must run the same adapters in
        the same order (the numbers of calls, hence of parts, differ between processes). Parts go in adapter order
        (``same_order``), a process with fewer making up the count with stand-ins that train nothing."""
        if not parts or self.most_over_processes is None:
            return parts
        arranged = self.same_order(parts, lambda part: part.adapters[0], parts[0].prompt_ids.device)
        return [self.stand_in(parts[0], p, pad_token_id) if isinstance(p, str) else p for p in arranged]

    def same_order(self, items: list, adapter_of, device) -> list:
        """``items`` (forwards, or groups of rows to forward) in adapter order, each adapter as many times as on the
        process with the most; a missing one is its adapter's name, for the caller's stand-in. Every process must
        call it alike (a collective on ``device``), under DeepSpeed with several processes only."""
        unknown = sorted({adapter_of(item) for item in items} - set(self.adapter_names))
        if unknown:
            raise ValueError(f"Forwards of {unknown}, not adapters this run trains.")
        counts = torch.tensor([sum(adapter_of(item) == a for item in items) for a in self.adapter_names])
        most = self.most_over_processes(counts.to(device)).tolist()
        arranged = []
        for adapter, count in zip(self.adapter_names, most):
            own = [item for item in items if adapter_of(item) == adapter]
            arranged += own + [adapter] * (int(count) - len(own))
        return arranged

    def stand_in(self, template, adapter: str, pad_token_id: int):
        """A one-sample part of ``adapter`` (and a role of it) that trains nothing (padding, no completion token, zero
        weight) but runs forward and backward like any other, made from the first sample of ``template``."""
        role = next(r for r, a in self.role_adapters.items() if a == adapter)
        return replace(template.blank_rows(1, pad_token_id=pad_token_id), adapters=[adapter], roles=[role])

    # -------------------------------------------------------------------------------------------------- helpers
    def _adapter_squares(self) -> dict[str, float]:
        squares = {}
        for adapter in self.adapter_names:
            grads = [p.grad for p in self.adapter_params(adapter).values() if p.grad is not None]
            squares[adapter] = float(sum(g.float().pow(2).sum() for g in grads)) if grads else 0.0
        return squares

    def weights_loaded(self) -> None:
        """After the adapters' weights were replaced (resume): every shadow mirrors its adapter again."""
        self._params.clear()
        for model in self.models.values():
            set_adapters_trainable(model, [*self.adapter_names, *self.shadows])
        for split in self.role_splits:
            split.sync_weights()

    def state_dict(self) -> dict | None:
        return self.coherence.state_dict() if self.coherence is not None else None

    def load_state_dict(self, state: dict) -> None:
        if self.coherence is not None:
            self.coherence.load_state_dict(state)
