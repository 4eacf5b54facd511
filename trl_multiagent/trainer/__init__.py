"""The trainer over TRL's ``GRPOTrainer``.

``MultiAgentGRPOTrainer`` (multiagent_grpo_trainer.py) runs a training step's five numbered steps; parts.py builds
what it is made of from the config; logps_before_update.py adds the log-probs from before an update and what reads
them; step_forwards.py runs the step's forwards over routed samples and the updates they make; grpo_seam.py
(``GRPOSeam``) is where it reaches TRL's private hooks and state; renamed_hooks.py keeps the trainer's names of 0.1.0
working, with a warning, until they go.
"""

from __future__ import annotations

from typing import Any

from . import multiagent_grpo_trainer
from .multiagent_grpo_trainer import MultiAgentGRPOTrainer

__all__ = ["MultiAgentGRPOTrainer"]


def __getattr__(name: str) -> Any:
    # `trl_multiagent.trainer` was the trainer's module before it became a folder: its other names still read there.
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(multiagent_grpo_trainer, name)
