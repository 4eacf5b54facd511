"""``lr_scheduler_steps="per_update"``: the learning-rate schedule advanced once per adapter update call.

Upstream verl's actor steps its scheduler at the end of every update call (the reference's multi-agent trainer makes
one call per role adapter under isolated policy), so with k adapters the schedule moves k times per training step
over a horizon of `max_steps`; its cosine is not clamped past the end (as the Trainer's cosine is not), so it rises
again. The Trainer keeps calling `step()` once after each of its optimizer steps; this wrapper turns that into one
step per update call.
"""

from __future__ import annotations


class UpdateCallScheduler:
    """The Trainer's scheduler, stepped once per adapter update call.

    Under the sequential mini-batch schedule, `starts(adapter)` comes before every mini-batch step: a run of one
    adapter's steps is one call, so a change of adapter within a training step ends the previous call (the next adapter
    trains at the next rate), and the Trainer's `step()` ends the last one. Under the merged schedule one optimizer
    step updates every adapter at once: the Trainer's `step()` counts as `calls_per_step` calls.
    """

    def __init__(self, scheduler, calls_per_step: int):
        self.scheduler, self.calls_per_step = scheduler, calls_per_step
        self.adapter: str | None = None  # the adapter of the current call, once `starts` has been told one

    def starts(self, adapter: str) -> None:
        if self.adapter is not None and adapter != self.adapter:
            self.scheduler.step()
        self.adapter = adapter

    def step(self) -> None:
        for _ in range(1 if self.adapter is not None else self.calls_per_step):
            self.scheduler.step()
        self.adapter = None

    def __getattr__(self, name: str):  # get_last_lr, state_dict, load_state_dict, last_epoch, optimizer, ...
        if name == "scheduler":  # not set yet (a copy being built): no recursion through this method
            raise AttributeError(name)
        return getattr(self.scheduler, name)
