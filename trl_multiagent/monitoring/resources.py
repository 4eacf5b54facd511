"""What the training process holds, logged with every step: for spotting leaks in long runs.

`monitor_resources=True` adds `resources/rss_mb` (resident memory), `resources/open_fds`, `resources/threads`,
`resources/child_processes` (all descendants, e.g. sandboxed programs still running) and `resources/output_dir_mb`
(the size of `output_dir`, checkpoints included) to each log line. A run that leaks shows a steady climb in one of
them after the first steps; `save_total_limit` is what keeps the last one bounded.
"""

from __future__ import annotations

import os

import psutil  # a dependency of accelerate, so of every TRL install
from transformers import TrainerCallback

MB = 2**20


def folder_size(path: str) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist yet); files removed while it walks are skipped,
    since checkpoint rotation may run beside it."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


def resource_sample(process: psutil.Process, output_dir: str) -> dict[str, float]:
    """The `resources/*` metrics of ``process`` now."""
    with process.oneshot():
        return {
            "resources/rss_mb": process.memory_info().rss / MB,
            "resources/open_fds": float(process.num_fds()),
            "resources/threads": float(process.num_threads()),
            "resources/child_processes": float(len(process.children(recursive=True))),
            "resources/output_dir_mb": folder_size(output_dir) / MB,
        }


class ResourceMonitorCallback(TrainerCallback):
    """Adds the process's `resources/*` metrics to every log line, and to ``state.log_history`` so that
    trainer_state.json keeps them. Placed before the report_to integrations, which then log them too."""

    def __init__(self) -> None:
        self.process = psutil.Process()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return control
        sample = resource_sample(self.process, args.output_dir)
        logs.update(sample)
        # Trainer.log stored a copy of the logs in log_history before calling the callbacks.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(sample)
        return control
