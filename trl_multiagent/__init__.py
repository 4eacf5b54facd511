"""trl-multiagent: train every role of a multi-agent LLM workflow with GRPO, on top of TRL.

The workflows import without torch (a workflow only says what roles say to each other); the config and the trainer,
which need torch and TRL, are imported on first use, so ``import trl_multiagent.workflows`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .common.moved_modules import serve_moved_modules
from .workflows import EvalOpt, OrchWorkers, SingleAgent, Voting, Workflow

if TYPE_CHECKING:
    from .config import MultiAgentGRPOConfig
    from .trainer import MultiAgentGRPOTrainer

_ON_FIRST_USE = {"MultiAgentGRPOConfig": ".config", "MultiAgentGRPOTrainer": ".trainer"}

__all__ = [
    "EvalOpt",
    "MultiAgentGRPOConfig",
    "MultiAgentGRPOTrainer",
    "OrchWorkers",
    "SingleAgent",
    "Voting",
    "Workflow",
]
__version__ = "0.2.0"
serve_moved_modules()  # the modules that moved into folders, under their old paths (common/moved_modules.py)


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_ON_FIRST_USE[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})
