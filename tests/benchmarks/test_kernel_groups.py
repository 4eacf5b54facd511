"""benchmarks/kernel_groups.py on a GPU profile's events as torch.profiler gives them (operations with their kernels,
shapes and parents; the kernels again as device events), which the CPU smoke run cannot produce: each kernel's time
counts once, in the group its operation belongs to."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from harness import ROOT
from torch.autograd import DeviceType

sys.path.insert(0, str(ROOT / "benchmarks"))
from kernel_groups import grouped_seconds  # noqa: E402

VOCAB, RANK = 151936, 64


def op(name, device_us=0.0, cpu_us=1.0, shapes=(), parent=None, kernels=()):
    return SimpleNamespace(
        name=name,
        device_type=DeviceType.CPU,
        self_device_time_total=device_us,
        self_cpu_time_total=cpu_us,
        input_shapes=[list(shape) for shape in shapes],
        cpu_parent=parent,
        kernels=[SimpleNamespace(name=k, duration=device_us) for k in kernels],
    )


def kernel(name, us):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, self_device_time_total=us)


class Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_gpu_kernel_time_goes_to_the_group_of_the_operation_that_launched_it():
    lora_layer = op("lora_layer", cpu_us=5)
    base_layer = op("base_layer", parent=lora_layer)
    sdpa = op("aten::scaled_dot_product_attention")
    launched = [
        lora_layer,
        base_layer,
        op("aten::mm", 400, shapes=[(5120, 2048), (2048, 6144)], parent=base_layer, kernels=["nvjet_tst_128x256"]),
        op("aten::mm", 30, shapes=[(5120, 2048), (2048, RANK)], parent=lora_layer, kernels=["sm90_gemm"]),
        op("aten::to", 20, shapes=[(5120, 2048)], parent=lora_layer, kernels=["elementwise_kernel"]),
        op("aten::mm", 25, shapes=[(RANK, 5120), (5120, 2048)], kernels=["sm90_gemm"]),  # a backward: no layer mark
        sdpa,
        op("aten::_scaled_dot_product_flash_attention", 300, parent=sdpa, kernels=["flash_fwd_kernel"]),
        op("aten::_scaled_dot_product_flash_attention_backward", 500, kernels=["flash_bwd_kernel"]),
        op("aten::mm", 200, shapes=[(4096, 2048), (2048, VOCAB)], kernels=["nvjet"]),
        op("_ChunkedLogProbFunction", 150, kernels=["_chunked_logprob_fwd_kernel"]),  # TRL's Triton kernel
        op("aten::mul", 40, kernels=["vectorized_elementwise_kernel"]),
    ]
    events = [
        *launched,
        op("cudaStreamSynchronize", cpu_us=700),
        op("cudaStreamSynchronize", cpu_us=300),
        # each kernel again as a device event: counted once, under its operation; two the profiler tied to none
        *[kernel(e.kernels[0].name, e.self_device_time_total) for e in launched if e.kernels],
        kernel("flash_fwd_kernel", 60),
        kernel("liger_rms_norm_kernel", 10),
    ]
    figures = grouped_seconds(Profile(events), vocab=VOCAB, lora_rank=RANK, on_device=True)
    assert figures["gemm_s"] == pytest.approx(400e-6)
    assert figures["lora_s"] == pytest.approx((30 + 20 + 25) * 1e-6)
    assert figures["attention_s"] == pytest.approx(800e-6)
    assert figures["lm_head_s"] == pytest.approx(350e-6)
    assert figures["elementwise_s"] == pytest.approx(40e-6)
    assert figures["unattributed_s"] == {"attention": pytest.approx(60e-6), "elementwise": pytest.approx(10e-6)}
    assert (figures["host_syncs"], figures["host_sync_s"]) == (2, pytest.approx(1e-3))
    assert sum(figures["shares"].values()) == pytest.approx(1, abs=1e-3)
