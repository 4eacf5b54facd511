"""``AdapterGroups``: adapter updates taken inside the DeepSpeed engine's optimizer step.

Under DeepSpeed the engine steps at the last backward of an update: its ZeRO optimizer reduces the gradients into
flat fp32 copies of the parameters (each process holding a partition), clips them by one norm over every parameter,
and calls the optimizer the Trainer built (``step()``) on those copies, one param group at a time. The trainer's code
never sees the gradients in between, so two parts of an adapter update happen in that optimizer's step, through
torch's public step hooks:

- **one adapter steps alone** (a mini-batch of ``update_schedule="mini_batches"``): every param group holds the
  parameters of one adapter and names it (``ADAPTER_KEY``); while an adapter steps alone, the other groups'
  gradients are hidden from the optimizer for the step (and put back after it), and a torch optimizer skips a
  parameter without gradient: their weights and their optimizer state (moments, step count) stay as they are, as
  without DeepSpeed, where the trainer drops their gradients instead;
- **each adapter clipped on its own** (``clip_grad_norm_per_adapter`` with ``update_schedule="merged"``): each
  group's gradient is clipped to ``max_grad_norm`` by its own norm (its partitions' squares summed over processes),
  and the engine's clipping, one norm over every group, is switched off (``engine_clipping_off``). A mini-batch
  step clips its adapter the engine's way: the others have no gradient, so the norm over all is its own.

No private name of DeepSpeed is read or written here; what is relied on is how ZeRO calls the client optimizer:
stages 1 and 2 with ``param_groups`` set to the one group being stepped, stage 3 with every group but that one empty,
each group's dict (our ``ADAPTER_KEY`` in it) kept and its ``params`` the flat fp32 partition with its gradient
(``_optimizer_step`` of ``runtime/zero/stage_1_and_2.py`` and ``stage3.py``, alike in DeepSpeed 0.18.6, setup.cfg's
floor, and 0.19.8). A partial optimizer offload, which ZeRO-3 steps with an optimizer of its own, is refused
(``training/mini_batches.check_schedule``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ADAPTER_KEY = "adapter"  # the key of a param group naming its adapter (None: parameters of no adapter)


def group_by_adapter(optimizer: torch.optim.Optimizer, adapter_of: dict[torch.nn.Parameter, str]) -> None:
    """Rebuild ``optimizer``'s param groups (none stepped yet) as one group per adapter and setting: each group of the
    Trainer's (weight decay or not) is cut by adapter, and an adapter's cuts with equal settings are one group."""
    groups: list[dict] = []
    for group in optimizer.param_groups:
        settings = {k: v for k, v in group.items() if k != "params"}
        for param in group["params"]:
            wanted = {**settings, ADAPTER_KEY: adapter_of.get(param)}
            same = next((g for g in groups if {k: v for k, v in g.items() if k != "params"} == wanted), None)
            if same is None:
                groups.append({**wanted, "params": [param]})
            else:
                same["params"].append(param)
    optimizer.param_groups = []
    for group in groups:
        optimizer.add_param_group(group)


class AdapterGroups:
    """The step hooks of an optimizer whose param groups ``group_by_adapter`` made.

    Args:
        clip_norm: clip each adapter's group to this norm in every step (0: the engine clips, or nothing does).
        sum_over_processes: sums a tensor over the processes, whose groups hold partitions of the gradients (the
            identity where every process holds them whole).
    """

    def __init__(self, *, clip_norm: float, sum_over_processes: Callable[[torch.Tensor], torch.Tensor]):
        self.clip_norm = clip_norm
        self.sum_over_processes = sum_over_processes
        self.alone: str | None = None  # the adapter that steps alone (None: every adapter with a gradient steps)
        self._hidden: list[tuple[torch.nn.Parameter, torch.Tensor]] = []

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.before_step(opt))
        optimizer.register_step_post_hook(lambda opt, args, kwargs: self.after_step())

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Hide the gradients of the groups of adapters that do not step; clip each stepping adapter's group. Every
        process takes its steps alike (ZeRO steps every group on every process), so the sums over processes match."""
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:  # ZeRO-3 empties every group but the one it steps
                continue
            adapter = group[ADAPTER_KEY]
            if self.alone is not None and adapter != self.alone:
                self._hidden += [(p, p.grad) for p in params]
                for param in params:
                    param.grad = None
            elif self.clip_norm > 0 and adapter is not None:
                local = torch.nn.utils.get_total_norm([p.grad for p in params])
                norm = self.sum_over_processes(local.float().pow(2)).sqrt()
                torch.nn.utils.clip_grads_with_norm_(params, self.clip_norm, norm)

    def after_step(self) -> None:
        """Give the hidden gradients back (ZeRO may keep writing into the same buffers)."""
        for param, grad in self._hidden:
            param.grad = grad
        self._hidden = []


def engine_clipping_off(deepspeed_plugin) -> None:
    """Switch off the engine's own clipping (``gradient_clipping`` of the DeepSpeed config, which the Trainer filled
    with ``max_grad_norm``) for the engine about to be built: the optimizer's groups clip themselves. Called from
    ``create_optimizer``, which the Trainer runs once it has finalised the config (``deepspeed_init`` in
    ``transformers.integrations.deepspeed``: finalise, then ask for the optimizer; so from 5.3, setup.cfg's floor, to
    5.25) and before accelerate builds the engine from ``deepspeed_plugin.deepspeed_config``. A copy replaces that
    dict, so the Trainer's own config (which another trainer of this process would check ``max_grad_norm`` against)
    keeps the value."""
    deepspeed_plugin.deepspeed_config = {**deepspeed_plugin.deepspeed_config, "gradient_clipping": 0.0}


def adapter_groups_for(
    args,
    installed,
    *,
    deepspeed_plugin,
    sum_over_processes: Callable[[torch.Tensor], torch.Tensor],
    decay_parameter_names: Callable[[torch.nn.Module], list[str]],
) -> AdapterGroups | None:
    """The groups a run's updates need under DeepSpeed (``deepspeed_plugin``, accelerate's; None without DeepSpeed):
    under ``update_schedule="mini_batches"`` and, with ``"merged"``, under ``clip_grad_norm_per_adapter``. What
    they cannot do is refused here, with the settings that work."""
    mini_batches = args.update_schedule == "mini_batches"
    clip_norm = args.max_grad_norm if args.clip_grad_norm_per_adapter and not mini_batches else 0.0
    if deepspeed_plugin is None or not (mini_batches or clip_norm > 0):
        return None
    zero = deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
    if clip_norm > 0:
        _check_one_group_each(args, installed, zero, decay_parameter_names)
    partitioned = int(zero.get("stage", 0)) >= 1  # ZeRO-1 to 3: each process steps its partition of a group
    return AdapterGroups(clip_norm=clip_norm, sum_over_processes=sum_over_processes if partitioned else lambda t: t)


def _check_one_group_each(args, installed, zero: dict, decay_parameter_names) -> None:
    """Each adapter is clipped within one step of one group: its parameters must make one group, which ZeRO-3 steps
    whole only up to ``sub_group_size`` elements."""
    others = "or --update_schedule mini_batches (each mini-batch step clips its adapter alone), or "
    others += "--clip_grad_norm_per_adapter false (one norm over all adapters)"
    params = {a: installed.parameters(a) for a in installed.adapter_names}
    if args.weight_decay != 0:
        decay = {base: set(decay_parameter_names(model)) for base, model in installed.models.items()}
        for adapter, named in params.items():
            if len({name in decay[installed.base_of[adapter]] for name in named}) > 1:
                raise ValueError(
                    "clip_grad_norm_per_adapter under DeepSpeed clips each adapter in the engine's optimizer step, "
                    f"one param group at a time, and adapter {adapter!r} has parameters with and without weight "
                    f"decay (two groups). Set --weight_decay 0, {others}."
                )
    sub_group = zero.get("sub_group_size", 1e9)  # DeepSpeed's default
    size, largest = max((sum(p.numel() for p in named.values()), a) for a, named in params.items())
    if int(zero.get("stage", 0)) == 3 and size > int(sub_group):
        raise ValueError(
            f"ZeRO-3 steps each param group in sub-groups of zero_optimization.sub_group_size={sub_group} elements, "
            f"and adapter {largest!r} has {size}, so its norm is not taken in one step. Set sub_group_size to at "
            f"least {size} in the DeepSpeed config, {others}."
        )
