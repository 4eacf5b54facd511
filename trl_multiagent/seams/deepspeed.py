"""DeepSpeed below its public surface (the names ``deepspeed``, ``deepspeed.zero`` and ``deepspeed.utils`` export, as
its API reference documents them). DeepSpeed is optional (the ``deepspeed`` extra): it is imported on first use.
Checked against DeepSpeed 0.18.6 (setup.cfg's floor) and 0.19.8."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch


def call_through_engine(engine, model: torch.nn.Module) -> Callable[..., Any]:
    """``model`` (a module the engine's own module holds) called through ``engine``'s forward, which does per forward
    what its backward relies on (ZeRO's gradient accumulation count, the backward prologue hooked on the outputs).
    ``DeepSpeedEngine.forward`` calls ``self.module(*inputs, **kwargs)`` (since 0.1): for that one call the engine's
    module's ``forward`` is replaced by ``model``'s (an instance attribute, deleted after, which uncovers the class's
    method again)."""

    def forward(*args, **kwargs):
        engine.module.forward = lambda *a, **k: model(*a, **k)
        try:
            return engine(*args, **kwargs)
        finally:
            del engine.module.forward

    return forward


def zero3_partitioned(params: Sequence[torch.nn.Parameter]) -> bool:
    """Whether ZeRO-3 partitions any of ``params``: ``zero.Init`` gives each parameter it partitions a ``ds_id``
    (``runtime/zero/partition_parameters.py``, since 0.3.12)."""
    return any(hasattr(p, "ds_id") for p in params)


@contextmanager
def gathered(params: Sequence[torch.nn.Parameter], modifier_rank: int | None = None) -> Iterator[None]:
    """``params`` whole while it lasts when ZeRO-3 partitions them (``deepspeed.zero.GatheredParameters``, public);
    with ``modifier_rank``, what that process writes into them is kept. Every process enters it: gathering is
    collective. A no-op for parameters ZeRO-3 does not partition."""
    if not zero3_partitioned(params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(params), modifier_rank=modifier_rank):
        yield


def clear_zero3_gradients(engine) -> None:
    """Zero ZeRO-3's reduced gradients after an engine step. ZeRO-3 keeps them in one flat buffer, the optimizer's
    ``grad_partitions_flat_buffer`` (``runtime/zero/stage3.py``, since 0.6; not a documented attribute), that the first
    backward of an accumulation overwrites and later ones add to (``partition_grads``), and ``zero_grad`` leaves as it
    is: a parameter that gets no gradient in the first backward (samples routed to another adapter, or another base)
    would add its new gradient to the previous step's, and one with no gradient in the whole step would be stepped
    with the previous step's again. Measured (tests/training/test_deepspeed_role_models.py, test_multinode.py).
    ZeRO-1 and ZeRO-2 zero their gradients themselves; a ZeRO-3 optimizer without the buffer (a DeepSpeed release that
    renamed it) fails here rather than train on stale gradients."""
    if engine.zero_optimization_stage() != 3:
        return
    buffer = getattr(engine.optimizer, "grad_partitions_flat_buffer", None)
    if buffer is None:
        raise RuntimeError(
            f"ZeRO-3's optimizer ({type(engine.optimizer).__name__}) has no `grad_partitions_flat_buffer`: this "
            "DeepSpeed release keeps its reduced gradients elsewhere, and trl-multiagent cannot clear them "
            "between steps. Use deepspeed 0.18.6 to 0.19 (both keep it there), or ZeRO-2."
        )
    buffer.zero_()
