"""A torch.profiler run's kernel time, grouped by what the kernels do: GEMM (the base model's linear layers),
attention, LM head, LoRA, elementwise (norms, activations, casts, copies: everything else) and host syncs (the host
waiting for the device).

Each operation's own device time (its kernels; on CPU its own host time) goes to one group, read from its name, its
input shapes and the LoRA layer it ran in:

- attention: SDPA, flash, efficient, cuDNN and flex attention, forward and backward, and the matrix products inside an
  attention operation (the math backend);
- LM head: a matrix product with the vocabulary as one dimension, and the kernels of TRL's log-probability
  computation over its logits (selective log-softmax, entropy);
- LoRA: a matrix product with the adapter rank as one dimension (A and B, forward and backward), and whatever ran
  inside a LoRA layer's own code around them (the input casts, the scaling), marked by hooks on the adapters' modules;
- GEMM: every other matrix product;
- host syncs: the number and host time of the calls that wait for the device (the synchronizations a ``.item()``,
  a ``.tolist()`` or a copy to the host ends in), reported apart since it is host time, not kernel time.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from types import SimpleNamespace

import torch
from torch.autograd import DeviceType

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm")
ATTENTION = ("attention", "flash", "fmha", "flex", "sdpa", "scaled_dot_product")
LM_HEAD_KERNELS = ("log_softmax", "logsumexp", "selective", "entropy", "logp")
# The calls in which the host waits for the device (a `.item()` or `.tolist()` of a GPU tensor ends in one); on CPU,
# where nothing waits, the scalar reads that would wait on a GPU
HOST_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
CPU_SYNCS = ("aten::_local_scalar_dense",)
LORA_RANGE = "lora_layer"
GROUPS = ("gemm", "attention", "lm_head", "lora", "elementwise")


def lora_ranges(model: torch.nn.Module) -> list:
    """Marks every LoRA layer's own work (its A and B products, input casts and scaling) with a profiler range, so
    that the grouping tells it apart from the base layer it wraps. Returns the hooks' handles."""
    from peft.tuners.lora import LoraLayer

    handles, open_ranges = [], []

    def enter(module, args):
        open_ranges.append(torch.autograd.profiler.record_function(LORA_RANGE))
        open_ranges[-1].__enter__()

    def leave(module, args, output):
        open_ranges.pop().__exit__(None, None, None)

    def base_enter(module, args):  # the wrapped base layer's product is GEMM, not LoRA
        open_ranges.append(torch.autograd.profiler.record_function("base_layer"))
        open_ranges[-1].__enter__()

    for module in model.modules():
        if isinstance(module, LoraLayer):
            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
            base = module.get_base_layer()
            handles.append(base.register_forward_pre_hook(base_enter))
            handles.append(base.register_forward_hook(leave))
    return handles


def grouped_seconds(profiler, *, vocab: int, lora_rank: int, on_device: bool) -> dict:
    """Seconds of device time (CPU smoke: host time) per group, the host syncs' seconds and count, and the share of
    each group in the total. On a GPU each kernel counts once, under the operation that launched it. Kernels the
    profiler tied to no operation (launched from Python, as Triton's are, outside any) are grouped by their own
    names alone, and reported apart as ``unattributed_s``: by name, LoRA's products cannot be told from the base's."""
    seconds: dict[str, float] = defaultdict(float)
    syncs, sync_s = 0, 0.0
    launched: Counter = Counter()  # kernel name -> microseconds, as device events
    attributed: Counter = Counter()  # the same, as the kernels of the operations that launched them
    for event in profiler.events():
        if event.device_type != DeviceType.CPU:
            launched[event.name] += event.self_device_time_total
            continue
        if event.name in (HOST_SYNCS if on_device else CPU_SYNCS):
            syncs += 1
            sync_s += event.self_cpu_time_total / 1e6
        own = event.self_device_time_total if on_device else event.self_cpu_time_total
        if own <= 0 or (not on_device and event.name.startswith(("cuda", "ProfilerStep"))):
            continue
        attributed.update({kernel.name: kernel.duration for kernel in event.kernels})
        seconds[group_of(event, vocab=vocab, lora_rank=lora_rank)] += own / 1e6
    total = sum(seconds.values())
    figures = {f"{group}_s": significant(seconds.get(group, 0.0)) for group in GROUPS}
    figures["total_s"] = significant(total)
    figures["shares"] = {group: round(seconds.get(group, 0.0) / total, 4) if total else 0.0 for group in GROUPS}
    if on_device:
        orphans: dict[str, float] = defaultdict(float)
        for name, microseconds in (launched - attributed).items():
            orphans[group_of_kernel(name, vocab=vocab)] += microseconds / 1e6
        figures["unattributed_s"] = {group: significant(value) for group, value in sorted(orphans.items())}
    figures["host_syncs"] = syncs
    figures["host_sync_s"] = significant(sync_s)
    return figures


def group_of_kernel(name: str, *, vocab: int) -> str:
    """The group of a kernel known by its name only."""
    event = SimpleNamespace(name=name, kernels=[], cpu_parent=None, input_shapes=[])
    return group_of(event, vocab=vocab, lora_rank=-1)


def significant(value: float) -> float:
    return float(f"{value:.4g}")


def group_of(event, *, vocab: int, lora_rank: int) -> str:
    """The group of one operation's own time: by its name and its kernels' names, the LoRA or base layer it ran
    in (forward), or its shapes (backward, where no layer is marked)."""
    name = " ".join([event.name, *(kernel.name for kernel in event.kernels)]).lower()
    ancestors = []
    parent = event.cpu_parent
    while parent is not None:
        ancestors.append(parent.name)
        parent = parent.cpu_parent
    if any(word in name for word in ATTENTION) or any("scaled_dot_product" in a for a in ancestors):
        return "attention"
    layer = next((a for a in ancestors if a in (LORA_RANGE, "base_layer")), None)
    dims = {d for shape in (event.input_shapes or []) for d in (shape or [])}
    if event.name in MATMULS or "gemm" in name or "nvjet" in name:
        if vocab in dims:
            return "lm_head"
        if layer is not None:
            return "lora" if layer == LORA_RANGE else "gemm"
        return "lora" if lora_rank in dims else "gemm"
    if any(word in name for word in LM_HEAD_KERNELS):
        return "lm_head"
    return "lora" if layer == LORA_RANGE else "elementwise"
