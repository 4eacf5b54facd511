"""Liger's kernels (the ``liger-kernel`` package) below its public surface, for ``use_liger_kernel``.

Liger replaces a model's RMSNorm, SwiGLU MLP and rotary embedding with Triton kernels. Its model-specific patch
functions (``apply_liger_kernel_to_qwen3`` and friends) are public; the one that picks the function from a loaded
model's ``model_type`` is ``liger_kernel.transformers._apply_liger_kernel_to_instance``, which transformers'
Trainer calls too (``use_liger_kernel``; in 5.25 through ``integrations.liger.apply_liger_kernel``). The trainer
patches every base model before PEFT wraps it; at ``train()`` the Trainer patches the trainer's base model once more,
with TRL's config (the same kernels: no change). Written against liger-kernel's source (0.6); not run here, where it
cannot run (no GPU): its tests observe the call.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import torch

# TRL 1.16 keeps Liger's fused linear cross-entropy off (it replaces the model's forward, which TRL patches with its
# own fused LM head to score completions); so does the trainer, whose log-probs are TRL's.
LAYER_KERNELS_ONLY = {"fused_linear_cross_entropy": False, "cross_entropy": False}


def liger_kernel_unavailable(*, use_cpu: bool) -> str | None:
    """Why Liger's kernels cannot run in this process (None when they can): not installed, no Triton, or no GPU."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed: `pip install liger-kernel`"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (Liger's kernels are Triton kernels; CPU builds of torch come without it)"
    if use_cpu or not torch.cuda.is_available():
        return "Liger's Triton kernels run on a CUDA GPU, and this run has none (`use_cpu`, or no GPU visible)"
    return None


def layer_kernel_config(liger_kernel_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments of Liger's patch: the user's ``liger_kernel_config`` with the loss kernels off."""
    return {**(liger_kernel_config or {}), **LAYER_KERNELS_ONLY}


def apply_liger_kernels(model: torch.nn.Module, kernel_config: Mapping[str, Any]) -> None:
    """Patch the loaded base ``model`` (a transformers model, before PEFT wraps it) with Liger's layer kernels."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=model, **kernel_config)


def layer_kernels(
    use_liger_kernel: bool, liger_kernel_config: Mapping[str, Any] | None
) -> Callable[[torch.nn.Module], None] | None:
    """What patches each base model of a run with Liger's layer kernels (None without ``use_liger_kernel``)."""
    if not use_liger_kernel:
        return None
    config = layer_kernel_config(liger_kernel_config)
    return lambda model: apply_liger_kernels(model, config)
