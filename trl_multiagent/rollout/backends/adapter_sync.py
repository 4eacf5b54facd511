"""``AdapterSync``: the trained adapters sent to the rollout backend once per optimizer step, before it samples.

A backend that keeps its own copy of the weights (vLLM, colocated or a server) needs the adapters as the last
optimizer step left them; the transformers backend samples from the trained model itself and has nothing to receive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch

from .from_config import sync_adapters


class AdapterSync:
    """Calling it sends the adapters to ``backend`` unless they were sent at this optimizer step already.

    Args:
        backend: the rollout backend (one with ``sync_adapters`` receives them; any other is left alone).
        unwrapped_model: the trainer's model to read the adapters from, as TRL unwraps it for generation (ZeRO-3's
            parameters gathered while it lasts).
        adapters_by_base: that model -> base name -> (its PEFT model, its adapters), the trainer's own base first.
        weights_step: the optimizer step the trained weights are at now.
        is_main_process: whether this is the main process (it alone sends to a backend every process shares).
        wait_for_everyone: a barrier across processes, so no process samples before every send is done.
    """

    def __init__(
        self,
        backend,
        *,
        unwrapped_model: Callable[[], AbstractContextManager[torch.nn.Module]],
        adapters_by_base: Callable[[torch.nn.Module], Mapping[Any, tuple[Any, list[str]]]],
        weights_step: Callable[[], int],
        is_main_process: bool,
        wait_for_everyone: Callable[[], None],
    ):
        self.backend, self.unwrapped_model, self.adapters_by_base = backend, unwrapped_model, adapters_by_base
        self.weights_step, self.is_main_process, self.wait_for_everyone = (
            weights_step,
            is_main_process,
            wait_for_everyone,
        )
        self.synced_step = -1  # the optimizer step whose adapters the backend holds

    def __call__(self) -> None:
        if not hasattr(self.backend, "sync_adapters") or self.synced_step == self.weights_step():
            return
        with self.unwrapped_model() as model:
            sync_adapters(self.backend, self.adapters_by_base(model), self.is_main_process)
        self.wait_for_everyone()
        self.synced_step = self.weights_step()
