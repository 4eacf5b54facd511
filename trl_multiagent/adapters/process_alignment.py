"""``ProcessAlignment``: what several processes must do alike for DDP and DeepSpeed to train the adapters as one
process would.

- DDP with roles on several bases: DDP averages the trainer's model's gradients only, so the other bases' are
  averaged here before each step (``average_extra_gradients``), and a micro-step's forwards end with the trainer's
  base on every process (``synchronised_last``: DDP synchronises on that last backward).
- DeepSpeed with several processes: ZeRO-2 reduces a forward's adapter's gradients during its backward and ZeRO-3
  gathers its weights during its forward, so every process runs the same adapters in the same order
  (``same_forwards``, ``same_order``).

A process short of a forward makes it up with a ``stand_in`` that trains nothing. With one process nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from accelerate.utils import DistributedType

from .installed import InstalledAdapters

Collective = Callable[[torch.Tensor], torch.Tensor]


class ProcessAlignment:
    """Aligns the processes training the adapters of ``installed``.

    Args:
        installed: the run's adapters and their bases.
        average: averages a tensor over processes (DDP with several bases; None: nothing to average).
        most_over_processes: the elementwise max of a tensor over processes (DeepSpeed with several processes; None:
            forwards need no alignment).
    """

    def __init__(self, installed: InstalledAdapters, *, average: Collective | None = None, most_over_processes=None):
        self.installed = installed
        self.average = average
        self.most_over_processes: Collective | None = most_over_processes

    @classmethod
    def for_processes(cls, installed: InstalledAdapters, accelerator=None) -> ProcessAlignment:
        """What ``accelerator``'s processes need: under DeepSpeed the one engine reduces every base's gradients and the
        processes align their forwards; under DDP the other bases' gradients are averaged as DDP averages the
        trainer's; with one process (or no accelerator) nothing."""
        if accelerator is None or accelerator.num_processes == 1:
            return cls(installed)
        if accelerator.distributed_type == DistributedType.DEEPSPEED:
            return cls(
                installed, most_over_processes=lambda tensor: accelerator.gather(tensor[None]).max(dim=0).values
            )
        if len(installed.models) > 1:
            return cls(installed, average=lambda tensor: accelerator.reduce(tensor, reduction="mean"))
        return cls(installed)

    @property
    def aligns_forwards(self) -> bool:
        """Whether every process must run the same forwards (DeepSpeed with several processes)."""
        return self.most_over_processes is not None

    def average_extra_gradients(self) -> None:
        """DDP averages the trainer's model's gradients; the other bases' are averaged here, in one collective. A
        parameter without gradient on every process keeps none (a zero gradient would still move it through Adam)."""
        if self.average is None:
            return
        params = self.installed.extra_parameters()
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
        installed = self.installed
        on_main = [p for p in parts if installed.on_main_base(p.adapters[0])]
        if not on_main:
            main_adapter = next(a for a in installed.adapter_names if installed.on_main_base(a))
            on_main = [self.stand_in(parts[0], main_adapter, pad_token_id)]
        return [p for p in parts if not installed.on_main_base(p.adapters[0])] + on_main

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
        adapter_names = self.installed.adapter_names
        unknown = sorted({adapter_of(item) for item in items} - set(adapter_names))
        if unknown:
            raise ValueError(f"Forwards of {unknown}, not adapters this run trains.")
        counts = torch.tensor([sum(adapter_of(item) == a for item in items) for a in adapter_names])
        most = self.most_over_processes(counts.to(device)).tolist()
        arranged = []
        for adapter, count in zip(adapter_names, most):
            own = [item for item in items if adapter_of(item) == adapter]
            arranged += own + [adapter] * (int(count) - len(own))
        return arranged

    def stand_in(self, template, adapter: str, pad_token_id: int):
        """A one-sample part of ``adapter`` (and a role of it) that trains nothing (padding, no completion token, zero
        weight) but runs forward and backward like any other, made from the first sample of ``template``."""
        role = next(r for r, a in self.installed.role_adapters.items() if a == adapter)
        return replace(template.blank_rows(1, pad_token_id=pad_token_id), adapters=[adapter], roles=[role])
