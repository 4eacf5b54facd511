"""PEFT below its public surface (the names ``peft`` exports at top level): the LoRA layers, as per-sample routing
reaches them. Checked against PEFT 0.20 (setup.cfg's floor) and 0.21.

PEFT's public ways to choose adapters do not fit training several at once: ``set_adapter`` (model or layer) marks
every other adapter's weights ``requires_grad=False``, and ``adapter_names=`` on the model's forward refuses training
mode. The router points each layer's active adapter directly, and hands per-sample names to the layers the way
PEFT's own ``adapter_names`` path does; tests/adapters/test_routing.py shows both give the outputs and gradients of
PEFT's public paths (``set_adapter`` per adapter, ``disable_adapter``, ``adapter_names=`` in eval mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# `tuners.lora.LoraLayer` (since 0.0.1; in the `tuners/lora/` package since 0.6): the base class of every layer LoRA
# wraps. `tuners.lora.layer.ParamWrapper` (since 0.17): LoRA on a parameter (MoE experts, routers) rather than on a
# module; it applies one weight to the batch's tokens flattened, so it cannot mix adapters within a batch.
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import ParamWrapper

# One adapter's samples in a mixed batch: its name and the indices of its rows, on the batch's device.
AdapterRows = tuple[str, torch.Tensor]


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every LoRA layer of ``model``, in module order."""
    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def applies_one_adapter_per_forward(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` is LoRA on a weight (``ParamWrapper``), which sees tokens flat and mixes no adapters."""
    return isinstance(layer, ParamWrapper)


def point_at(layer: torch.nn.Module, adapters: str | list[str]) -> None:
    """Make ``adapters`` the adapters ``layer`` applies, without touching any weight's ``requires_grad``. PEFT keeps
    them in the private ``BaseTunerLayer._active_adapter`` (since 0.3), which its forward reads on every call and
    ``set_adapter`` writes after changing ``requires_grad``; a name that is no adapter of the layer (``"__base__"``)
    makes its forward skip LoRA. Read it back with the public ``layer.active_adapter``."""
    layer._active_adapter = adapters


def pass_adapter_names(
    layer: torch.nn.Module, adapter_names_for: Callable[[torch.nn.Module, torch.Tensor], Sequence[str] | None]
) -> torch.utils.hooks.RemovableHandle:
    """Call ``layer`` with ``adapter_names=adapter_names_for(layer, x)`` (one name per sample of ``x``) whenever that
    is not None. A LoRA layer's forward takes ``adapter_names`` (since 0.10) and applies each sample's own adapter
    (``_mixed_batch_forward``); PEFT's model forward passes them the same way, through a forward pre-hook on every
    layer (``_adapter_names_pre_forward_hook``), but only outside training. The hook reads the names at call time, so
    the recomputation of a checkpointed layer in backward sees the names its forward saw."""

    def hook(module, args, kwargs):
        names = adapter_names_for(module, args[0] if args else kwargs["x"])
        if names is None:
            return None
        kwargs["adapter_names"] = names
        return args, kwargs

    return layer.register_forward_pre_hook(hook, with_kwargs=True)


def adds_rows_itself(layer: torch.nn.Module) -> bool:
    """Whether ``add_adapter_rows`` computes ``layer``'s mixed batches: a LoRA ``Linear``
    (``tuners.lora.layer.Linear``, since 0.0.1) none of whose adapters is a variant (DoRA and the others in
    ``lora_variant``, since 0.15), i.e. the layers whose mixed path in PEFT is
    ``result[rows] += lora_B(lora_A(dropout(x[rows]))) * scaling``."""
    return isinstance(layer, LoraLinear) and not layer.lora_variant


def add_adapter_rows(
    layer: torch.nn.Module, x: torch.Tensor, output: torch.Tensor, rows: Sequence[AdapterRows]
) -> torch.Tensor:
    """``output`` (``layer``'s base on ``x``) plus each adapter's LoRA on its own rows, as PEFT's mixed-batch path
    (``Linear._mixed_batch_forward``) computes it, but from row indices already on the device: PEFT indexes with
    Python lists in every layer, a blocking host-to-device copy each (two per adapter per layer per forward, which on a
    GPU stalls every decoding step). Reads the layer's ``lora_A``, ``lora_B``, ``lora_dropout`` and ``scaling``
    (public attributes of ``LoraLayer`` since 0.0.1); calling the modules lets DeepSpeed ZeRO-3 gather their weights.
    Out of place, so autograd and checkpointed recomputation see the same graph."""
    for adapter, index in rows:
        if adapter not in layer.lora_A:  # the base model's rows, or an adapter this base does not hold
            continue
        sub_batch = x.index_select(0, index).to(layer.lora_A[adapter].weight.dtype)
        lora = layer.lora_B[adapter](layer.lora_A[adapter](layer.lora_dropout[adapter](sub_batch)))
        output = output.index_add(0, index, (lora * layer.scaling[adapter]).to(output.dtype))
    return output


def add_rows_after(
    layer: torch.nn.Module, rows_for: Callable[[torch.nn.Module, torch.Tensor], Sequence[AdapterRows] | None]
) -> torch.utils.hooks.RemovableHandle:
    """After each call of ``layer`` (pointed at no adapter, so its forward is its base layer's), add the LoRA of the
    adapters ``rows_for(layer, x)`` names, on their rows (``add_adapter_rows``); nothing when it returns None."""

    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["x"]
        rows = rows_for(module, x)
        return None if rows is None else add_adapter_rows(module, x, output, rows)

    return layer.register_forward_hook(hook, with_kwargs=True)


def skip_input_casts_autocast_undoes(model: torch.nn.Module) -> None:
    """Stop every LoRA layer of ``model`` casting its input to its weights' dtype where autocast would cast it back.

    PEFT keeps LoRA weights in fp32 on a bf16 (or fp16) base (``autocast_adapter_dtype=True``, its default), and each
    LoRA layer's forward casts its input to the weights' dtype first (``BaseTunerLayer._cast_input_dtype``, since
    0.14): under autocast the LoRA products then run in the half dtype anyway, autocast casting that fp32 copy back
    (and the weights once per autocast region). Skipping the cast there gives the same products, gradients and fp32
    weights (and fp32 optimizer state) without two activation-sized copies per layer and forward. Outside autocast,
    or for an input of another dtype, PEFT's cast runs as before. PEFT's mixed-adapter forward (``adapter_names``,
    ``mix_adapters_in_forward``) casts on its own path, which this leaves alone."""
    for layer in lora_layers(model):
        if not isinstance(layer._cast_input_dtype, _CastUnlessAutocast):
            layer._cast_input_dtype = _CastUnlessAutocast(layer._cast_input_dtype)


class _CastUnlessAutocast:
    """A LoRA layer's input cast, skipped where autocast computes in the input's dtype (see above)."""

    def __init__(self, cast: Callable):
        self.cast = cast

    def __call__(self, x, dtype: torch.dtype):
        if x is not None and dtype == torch.float32 and x.dtype in (torch.bfloat16, torch.float16):
            device = x.device.type
            if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == x.dtype:
                return x
        return self.cast(x, dtype)
