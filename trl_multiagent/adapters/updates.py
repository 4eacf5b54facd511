"""``AdapterUpdates``: the role adapters of a run and how each one is updated, behind four calls of the trainer.

1. ``routing(adapters, roles, training)``: the adapter of every sample of a micro-batch, for its forward (and
   the recomputation of checkpointed layers in backward); training routes to shadows where a schedule needs them;
2. ``before_optimizer_step()``: once the gradients are complete: per-role shadow gradients merged back, gradient
   norms measured, coherence damping applied; returns the metrics;
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

import torch

from ..monitoring.role_metrics import grad_norm_metrics
from .coherence import CoherenceDamping
from .role_gradients import RoleGradientSplit
from .routing import AdapterRouter, adapter_parameters, install_role_adapters, set_adapters_trainable, unique_adapters


class AdapterUpdates:
    """Installs one adapter per name of ``role_adapters`` on ``peft_model`` and runs their update schedule.

    Args:
        peft_model: the PEFT model with its ``default`` adapter (replaced by the role adapters).
        role_adapters: role type -> adapter name.
        monitor_role_grad_norms: measure each role's gradient under a shared adapter through role shadows.
        coherence_lambda, coherence_window: per-role coherence damping (``role_coherence_lambda``).
        measure_gradients: False where the gradients are not in ``.grad`` (DeepSpeed partitions them).
    """

    def __init__(
        self,
        peft_model,
        role_adapters: dict[str, str],
        monitor_role_grad_norms: bool = False,
        coherence_lambda: dict[str, float] | None = None,
        coherence_window: int = 10,
        measure_gradients: bool = True,
    ):
        self.model = peft_model
        self.role_adapters = dict(role_adapters)
        self.adapter_names = unique_adapters(self.role_adapters)
        self.measure_gradients = measure_gradients
        self._params: dict[str, list[torch.nn.Parameter]] = {}  # each adapter's LoRA weights, found once
        install_role_adapters(peft_model, self.adapter_names)
        self.router = AdapterRouter(peft_model)
        self.role_split = None
        if monitor_role_grad_norms and not self.router.mixes_adapters:
            raise ValueError(
                "`monitor_role_grad_norms` routes each role of a shared adapter to its own shadow inside one batch, "
                "which LoRA on MoE expert weights cannot do. Turn it off, or leave the experts out of "
                "`target_modules`."
            )
        if monitor_role_grad_norms and len(self.adapter_names) < len(self.role_adapters):
            self.role_split = RoleGradientSplit(peft_model, self.role_adapters, self.adapter_names)
        self.coherence = self._coherence(coherence_lambda or {}, coherence_window)

    @classmethod
    def from_config(cls, peft_model, role_adapters, args, measure_gradients: bool):
        """The adapters and schedule a ``MultiAgentGRPOConfig`` asks for."""
        return cls(
            peft_model,
            role_adapters,
            monitor_role_grad_norms=args.monitor_role_grad_norms,
            coherence_lambda=args.role_coherence_lambda,
            coherence_window=args.role_coherence_window,
            measure_gradients=measure_gradients,
        )

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
        return self.role_split.shadows if self.role_split is not None else []

    @contextmanager
    def shadows_frozen(self) -> Iterator[None]:
        """While the optimizer is created: shadows carry gradients but are never optimised."""
        params = [p for s in self.shadows for p in adapter_parameters(self.model, s).values()]
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
        if training and self.role_split is not None:
            return self.role_split.routing(adapters, roles)
        return list(adapters)

    def before_optimizer_step(self) -> dict[str, float]:
        """2. Complete each adapter's gradient, measure it, damp it; returns the `adapter/` and `role/` metrics."""
        role_squares = {}
        if self.role_split is not None:
            role_squares = self.role_split.role_squares()
            self.role_split.merge()
        if not self.measure_gradients:
            return {}
        metrics = grad_norm_metrics(self._adapter_squares(), self.role_adapters, role_squares)
        if self.coherence is not None:
            for adapter in self.coherence.lambdas:
                grads = [p.grad for p in self.parameters_of(adapter) if p.grad is not None]
                if grads:
                    cosine, scale = self.coherence.apply(adapter, grads)
                    metrics[f"adapter/{adapter}/coherence_cos"] = cosine
                    metrics[f"adapter/{adapter}/coherence_scale"] = scale
        return metrics

    def clip(self, max_norm: float) -> torch.Tensor:
        """3. Clip each adapter's gradient to ``max_norm`` on its own; returns the norm over all of them."""
        norms = []
        for adapter in self.adapter_names:
            params = [p for p in self.parameters_of(adapter) if p.grad is not None]
            if params:
                norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return torch.stack(norms).norm() if norms else torch.tensor(0.0)

    def keep_only(self, adapter: str) -> None:
        """3. Drop every gradient but ``adapter``'s, so the next optimizer step moves that adapter alone (an optimizer
        skips parameters without gradient; a zero gradient would still move them through its momentum)."""
        keep = set(self.parameters_of(adapter))
        for param in self.model.parameters():
            if param.grad is not None and param not in keep:
                param.grad = None

    def after_optimizer_step(self) -> None:
        """4. Shadows take the weights the step produced."""
        if self.role_split is not None:
            self.role_split.sync_weights()

    def attach(self, optimizer) -> None:
        """Make ``optimizer.step`` run call 4 (the Trainer calls ``optimizer.step()`` itself)."""
        single_step = optimizer.step

        def step(_optimizer, closure=None):
            single_step(closure)
            self.after_optimizer_step()

        # A bound method, as torch's LR schedulers expect: each `train()` builds a new one, which wraps `step` through
        # its `__func__` (a plain function there failed the second `train()` of a trainer).
        optimizer.step = types.MethodType(step, optimizer)

    # -------------------------------------------------------------------------------------------------- helpers
    def parameters_of(self, adapter: str) -> list[torch.nn.Parameter]:
        """The LoRA weights of ``adapter``: looked up by name once (a scan of every parameter name, which per step
        and per adapter cost isolated policy ~4% of a tiny model's step), then kept."""
        if adapter not in self._params:
            self._params[adapter] = list(adapter_parameters(self.model, adapter).values())
        return self._params[adapter]

    def _adapter_squares(self) -> dict[str, float]:
        squares = {}
        for adapter in self.adapter_names:
            grads = [p.grad for p in self.parameters_of(adapter) if p.grad is not None]
            squares[adapter] = float(sum(g.float().pow(2).sum() for g in grads)) if grads else 0.0
        return squares

    def weights_loaded(self) -> None:
        """After the adapters' weights were replaced (resume): every shadow mirrors its adapter again."""
        self._params.clear()
        set_adapters_trainable(self.model, [*self.adapter_names, *self.shadows])
        if self.role_split is not None:
            self.role_split.sync_weights()

    def state_dict(self) -> dict | None:
        return self.coherence.state_dict() if self.coherence is not None else None

    def load_state_dict(self, state: dict) -> None:
        if self.coherence is not None:
            self.coherence.load_state_dict(state)
