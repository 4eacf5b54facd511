"""The run's configuration.

``MultiAgentGRPOConfig`` (multiagent_grpo_config.py) adds the multi-agent fields to TRL's ``GRPOConfig``;
grpo_config_fields.py says what happens to each of ``GRPOConfig``'s own fields (honoured, refused, or without
effect); run_checks.py makes every check of a run's settings that needs no weights, before the trainer loads any
(``--validate`` makes the same ones).
"""

from __future__ import annotations

from typing import Any

from . import multiagent_grpo_config
from .multiagent_grpo_config import MultiAgentGRPOConfig

__all__ = ["MultiAgentGRPOConfig"]


def __getattr__(name: str) -> Any:
    # `trl_multiagent.config` was the config's module before it became a folder: its other names still read from there.
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(multiagent_grpo_config, name)
