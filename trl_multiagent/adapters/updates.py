"""``AdapterUpdates``: the role adapters of a run and how each one is updated, behind four calls of the trainer.

1. ``routing(adapters, roles, instances)``: the adapter of every sample of a micro-batch, for its forward (and
   the recomputation of checkpointed layers in backward); training routes to shadows where a schedule needs them;
2. ``before_optimizer_step()``: once the gradients are complete: per-role shadow gradients merged back, gradient
   norms measured, coherence damping applied; returns the metrics;
3. ``step(optimizer_step)``: the optimizer step (one, or one per instance of a parallel role);
4. ``after_optimizer_step()``: shadows take the new weights.

Shadows are extra adapters that only carry gradients: per instance of a parallel role (``InstanceSteps``) or per
role of a shared adapter (``RoleGradientSplit``, for monitoring). They are never optimised or saved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..monitoring.role_metrics import grad_norm_metrics
from ..rollout.records import Episode
from .coherence import CoherenceDamping
from .instance_steps import InstanceSteps
from .role_gradients import RoleGradientSplit
from .routing import AdapterRouter, adapter_parameters, install_role_adapters, set_adapters_trainable, unique_adapters


class AdapterUpdates:
    """Installs one adapter per name of ``role_adapters`` on ``peft_model`` and runs their update schedule.

    Args:
        peft_model: the PEFT model with its ``default`` adapter (replaced by the role adapters).
        role_adapters: role type -> adapter name.
        parallel_role_steps: ``"merged"`` or ``"per_instance"`` (see ``MultiAgentGRPOConfig``).
        probe: one episode of the workflow (empty outputs) to find the parallel roles; needed for ``per_instance``.
        monitor_role_grad_norms: measure each role's gradient under a shared adapter through role shadows.
        coherence_lambda, coherence_window: per-role coherence damping (``role_coherence_lambda``).
        measure_gradients: False where the gradients are not in ``.grad`` (DeepSpeed partitions them).
    """

    def __init__(
        self,
        peft_model,
        role_adapters: dict[str, str],
        parallel_role_steps: str = "merged",
        probe: Episode | None = None,
        monitor_role_grad_norms: bool = False,
        coherence_lambda: dict[str, float] | None = None,
        coherence_window: int = 10,
        measure_gradients: bool = True,
    ):
        self.model = peft_model
        self.role_adapters = dict(role_adapters)
        self.adapter_names = unique_adapters(self.role_adapters)
        self.measure_gradients = measure_gradients
        install_role_adapters(peft_model, self.adapter_names)
        self.router = AdapterRouter(peft_model)
        self.instance_steps = None
        if parallel_role_steps == "per_instance":
            self.instance_steps = self._instance_steps(probe)
        self.role_split = None
        if monitor_role_grad_norms and len(self.adapter_names) < len(self.role_adapters):
            trainable = [*self.adapter_names, *(self.instance_steps.shadows if self.instance_steps else [])]
            self.role_split = RoleGradientSplit(peft_model, self.role_adapters, trainable)
        self.coherence = self._coherence(coherence_lambda or {}, coherence_window)

    @classmethod
    def from_config(cls, peft_model, role_adapters, args, probe: Episode | None, measure_gradients: bool):
        """The adapters and schedule a ``MultiAgentGRPOConfig`` asks for."""
        return cls(
            peft_model,
            role_adapters,
            parallel_role_steps=args.parallel_role_steps,
            probe=probe,
            monitor_role_grad_norms=args.monitor_role_grad_norms,
            coherence_lambda=args.role_coherence_lambda,
            coherence_window=args.role_coherence_window,
            measure_gradients=measure_gradients,
        )

    # ----------------------------------------------------------------------------------------------------- setup
    def _instance_steps(self, probe: Episode | None) -> InstanceSteps | None:
        if probe is None:
            raise ValueError("`parallel_role_steps='per_instance'` needs a train_dataset to find the parallel roles.")
        instances = defaultdict(int)
        for call in probe.calls:
            instances[call.role] = max(instances[call.role], call.instance + 1)
        parallel = {}
        for role, count in instances.items():
            if count < 2:
                continue
            adapter = self.role_adapters[role]
            sharing = [r for r, a in self.role_adapters.items() if a == adapter and r != role]
            if sharing:
                raise ValueError(
                    f"`parallel_role_steps='per_instance'` steps role {role!r}'s adapter once per instance, but "
                    f"{adapter!r} also serves {sharing}. Use policy_sharing='isolated' (or a mapping that gives "
                    f"{role!r} its own adapter), or parallel_role_steps='merged'."
                )
            parallel[adapter] = count
        return InstanceSteps(self.model, self.adapter_names, parallel) if parallel else None

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
            if self.instance_steps is not None and adapter in self.instance_steps.parallel:
                raise ValueError(
                    f"Coherence damping of {role!r} with parallel_role_steps='per_instance' is not supported; use "
                    "parallel_role_steps='merged' for that role."
                )
        return CoherenceDamping(lambdas, dict.fromkeys(lambdas, window))

    @property
    def shadows(self) -> list[str]:
        shadows = list(self.instance_steps.shadows) if self.instance_steps is not None else []
        return shadows + (self.role_split.shadows if self.role_split is not None else [])

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
    def routing(
        self, adapters: Sequence[str], roles: Sequence[str], instances: Sequence[int], training: bool
    ) -> list[str]:
        """1. The adapter (or shadow) every sample of a micro-batch goes through."""
        routing = list(adapters)
        if training and self.instance_steps is not None:
            routing = self.instance_steps.training_routing(routing, instances)
        if training and self.role_split is not None:
            routing = self.role_split.routing(routing, roles)
        return routing

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
                grads = [p.grad for p in adapter_parameters(self.model, adapter).values() if p.grad is not None]
                if grads:
                    cosine, scale = self.coherence.apply(adapter, grads)
                    metrics[f"adapter/{adapter}/coherence_cos"] = cosine
                    metrics[f"adapter/{adapter}/coherence_scale"] = scale
        return metrics

    def step(self, optimizer_step: Callable[[], None]) -> None:
        """3. The optimizer step: once, or for each instance of a parallel role on that instance's gradient."""
        if self.instance_steps is None:
            optimizer_step()
            return
        parallel = set(self.instance_steps.parallel)
        others = [
            p for a in self.adapter_names if a not in parallel for p in adapter_parameters(self.model, a).values()
        ]
        self.instance_steps.step(optimizer_step, others)

    def after_optimizer_step(self) -> None:
        """4. Shadows take the weights the step produced."""
        if self.role_split is not None:
            self.role_split.sync_weights()

    def attach(self, optimizer) -> None:
        """Make ``optimizer.step`` run calls 3 and 4 (the Trainer calls ``optimizer.step()`` itself)."""
        single_step = optimizer.step

        def step(closure=None):
            self.step(lambda: single_step(closure))
            self.after_optimizer_step()

        optimizer.step = step

    # -------------------------------------------------------------------------------------------------- helpers
    def _adapter_squares(self) -> dict[str, float]:
        squares = {}
        for adapter in self.adapter_names:
            if self.instance_steps is not None and adapter in self.instance_steps.parallel:
                grads = self.instance_steps.summed_gradients(adapter)
            else:
                grads = [p.grad for p in adapter_parameters(self.model, adapter).values() if p.grad is not None]
            squares[adapter] = float(sum(g.float().pow(2).sum() for g in grads)) if grads else 0.0
        return squares

    def weights_loaded(self) -> None:
        """After the adapters' weights were replaced (resume): every shadow mirrors its adapter again."""
        set_adapters_trainable(self.model, [*self.adapter_names, *self.shadows])
        if self.instance_steps is not None:
            self.instance_steps.sync_weights()
        if self.role_split is not None:
            self.role_split.sync_weights()

    def state_dict(self) -> dict | None:
        return self.coherence.state_dict() if self.coherence is not None else None

    def load_state_dict(self, state: dict) -> None:
        if self.coherence is not None:
            self.coherence.load_state_dict(state)
