"""Timing and profiling a trainer's phases on a GPU, without changing what it computes: seconds per phase of each
optimizer step (waiting for the device at every boundary), kernel tables, and counts of dispatched operations."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import PrinterCallback, TrainerCallback


class PhaseClock(TrainerCallback):
    """Seconds per phase of each optimizer step, waiting for the GPU at every boundary so kernels count where they
    run. Phases: rollout, logps_before_update (forwards without gradient), loss_forward, backward, optimizer."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        self.steps: list[dict] = []
        self.current: dict = defaultdict(float)
        self.samples: list[tuple[int, int]] = []  # (tokens, completion tokens) of the step's training samples
        self.forward_tokens = [0, 0]  # real, padded tokens of the step's log-prob forwards
        self.in_rollout = False
        self.phase: str | None = None  # the phase running now, for hooks that record what each phase runs
        self.work = None  # an ExecutedWork, reset at each step's start and kept with the step's figures
        self.handles: list = []
        self._began = 0.0

    def timed(self, phase, fn):
        def run(*args, **kwargs):
            name = phase(*args, **kwargs) if callable(phase) else phase
            self.sync()
            began, outer, self.phase = time.perf_counter(), self.phase, name
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.phase = outer
                self.current[name] += time.perf_counter() - began

        return run

    def on_step_begin(self, args, state, control, **kwargs):
        self.current, self.samples, self.forward_tokens = defaultdict(float), [], [0, 0]
        if self.work is not None:
            self.work.reset()
        self.sync()
        self._began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.sync()
        step = dict(self.current, step=time.perf_counter() - self._began)
        step["samples"] = list(self.samples)
        step["forward_tokens"] = list(self.forward_tokens)
        if self.work is not None:
            step["work"] = dict(self.work.phases)
        self.steps.append(step)


def logp_phase(model, input_ids, attention_mask, *args, **kwargs) -> str:
    return "loss_forward" if torch.is_grad_enabled() else "logps_before_update"


def clocked_trainer(trainer, clock: PhaseClock):
    """Wrap the trainer's phases with ``clock`` (attributes of this one instance; nothing global stays changed)."""
    run_episodes = trainer.engine.run

    def recorded(*args, **kwargs):
        clock.in_rollout = True  # the rollout's own forwards (generation) are not training forwards
        try:
            episodes = run_episodes(*args, **kwargs)
        finally:
            clock.in_rollout = False
        for call in (c for e in episodes for c in e.calls):
            clock.samples.append((len(call.prompt_ids) + len(call.completion_ids), len(call.completion_ids)))
        return episodes

    def counted(module, args, kwargs):  # the tokens each forward gives the model, padding included
        mask = kwargs.get("attention_mask")
        if mask is not None and not clock.in_rollout:
            clock.forward_tokens[0] += int(mask.sum())
            clock.forward_tokens[1] += mask.numel()

    clock.handles.append(trainer.model.register_forward_pre_hook(counted, with_kwargs=True))
    trainer.engine.run = clock.timed("rollout", recorded)
    trainer._logps_and_entropies = clock.timed(logp_phase, trainer._logps_and_entropies)
    trainer.accelerator.backward = clock.timed("backward", trainer.accelerator.backward)
    trainer.add_callback(clock)
    trainer.remove_callback(PrinterCallback)


def optimizer_clock(clock: PhaseClock):
    """Time every optimizer step (the Trainer's and each mini-batch's own) with torch's global step hooks."""
    state = {}

    def before(optimizer, args, kwargs):
        clock.sync()
        state["began"] = time.perf_counter()

    def after(optimizer, args, kwargs):
        clock.sync()
        clock.current["optimizer"] += time.perf_counter() - state.pop("began")

    return [
        register_optimizer_step_pre_hook(before),
        register_optimizer_step_post_hook(after),
    ]


class ProfiledStep(TrainerCallback):
    """torch.profiler over the trainer's step number ``step``; its kernel table (by device time) goes to ``path``
    and the finished profiler stays in ``done``."""

    def __init__(self, device: torch.device, step: int, path: Path):
        self.device, self.step, self.path, self.profiler, self.done = device, step, path, None, None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self.profiler = kernel_profiler(self.device)
            self.profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            write_profile(self.profiler, self.device, self.path)
            self.done, self.profiler = self.profiler, None


def kernel_profiler(device: torch.device):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True)


def write_profile(profiler, device: torch.device, path: Path) -> None:
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = profiler.key_averages()
    text = averages.table(sort_by=sort, row_limit=40, max_name_column_width=70)
    shapes = profiler.key_averages(group_by_input_shape=True).table(
        sort_by=sort, row_limit=25, max_name_column_width=50
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    host = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
    path.write_text(f"{text}\n\nBy input shape:\n{shapes}\n\nBy host time:\n{host}\n")
    print(f"profile written: {path}", flush=True)


class DeviceOps(TorchDispatchMode):
    """Counts the operations dispatched (a kernel launch each on a GPU, where decoding is launch-bound) and the
    tensors made from Python data (each a blocking host-to-device copy on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = self.from_python = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.from_python += func.overloadpacket == torch.ops.aten.lift_fresh
        return func(*args, **(kwargs or {}))
