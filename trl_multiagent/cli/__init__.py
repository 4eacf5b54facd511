"""The command line and launching: ``trl-multiagent`` and what the recipes parse their flags with.

commands.py is the ``trl-multiagent`` command (train, eval, grid, vllm-serve, report); recipe_parser.py the recipes'
``TrlParser`` over presets, shipped.py the presets and configs shipped beside the package; validation.py is
``--validate`` (a launch's settings checked without loading a model); vllm_serve.py and serve_process.py start vLLM
servers for the roles; slurm.py runs the grid on a SLURM cluster; report.py writes one HTML page of a run. Nothing
here is imported by the trainer.
"""

from __future__ import annotations

from typing import Any

from . import commands
from .commands import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    # `trl_multiagent.cli` was the command's module before it became a folder: its other names still read from there.
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(commands, name)
