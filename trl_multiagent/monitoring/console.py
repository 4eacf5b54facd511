"""One compact console line per training step; every metric still goes to ``report_to`` and ``trainer_state.json``.

A multi-agent step logs 40-60 keys (``role/<role>/...`` for every role, ``workflow/...``, TRL's own): printed as a
dict each step they bury the progress bar. ``compact_console(callbacks)`` replaces that dict with a line such as::

    step 12/100 | success 0.531 | generator len 41.2 correct 0.52 | evaluator len 30.1 | verdict_accuracy 0.781

(``len``: mean completion tokens of the role's calls; ``correct``: ``workflow/regraded/<role>``, the role's own
answers checked against the ground truth, when an ``answer_checker`` is set).
"""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

# Workflow-level judge metrics worth a glance, when the workflow logs them.
_JUDGE_METRICS = ("verdict_accuracy", "selection_accuracy")


def console_line(logs: dict[str, Any], step: int, max_steps: int) -> str | None:
    """The step's line, or None for a log without role metrics (eval logs, the end-of-training summary)."""
    roles = list(dict.fromkeys(key.split("/")[1] for key in logs if key.startswith("role/") and key.count("/") >= 2))
    if not roles:
        return None
    parts = [f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"]
    if (success := logs.get("workflow/success")) is not None:  # TRL logs None for a metric with no finite value
        parts.append(f"success {success:.3f}")
    for role in roles:
        role_part = role
        if (length := logs.get(f"role/{role}/completion_length")) is not None:
            role_part += f" len {length:.1f}"
        if (correct := logs.get(f"workflow/regraded/{role}")) is not None:
            role_part += f" correct {correct:.2f}"
        parts.append(role_part)
    judged = [(name, logs.get(f"workflow/{name}")) for name in _JUDGE_METRICS]
    parts += [f"{name} {value:.3f}" for name, value in judged if value is not None]
    parts += [key for key in logs if key.startswith("alarm/")]
    return " | ".join(parts)


class RoleConsoleCallback(TrainerCallback):
    """Prints ``console_line`` for each training log (main process), above the progress bar when there is one;
    logs without role metrics (eval, the final summary) are printed as their plain scalar keys."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        line = console_line(logs, state.global_step, state.max_steps)
        if line is None:
            line = str({k: round(v, 4) if isinstance(v, float) else v for k, v in logs.items() if "/" not in k})
        tqdm.write(line)


class _QuietProgressCallback(ProgressCallback):
    """TRL's progress bars without the metrics dict printed under them at every log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def compact_console(callbacks: list[TrainerCallback]) -> None:
    """Replace the per-log metrics dict on the console with one ``console_line`` per step, in a trainer's callback
    list (``trainer.callback_handler.callbacks``, changed in place; once: calling it again changes nothing)."""
    callbacks[:] = [
        _QuietProgressCallback() if type(callback) is ProgressCallback else callback
        for callback in callbacks
        if not isinstance(callback, PrinterCallback)  # what Trainer prints logs with when disable_tqdm=True
    ]
    if not any(isinstance(callback, RoleConsoleCallback) for callback in callbacks):
        callbacks.append(RoleConsoleCallback())
