"""What to run to resume a stopped run: its newest complete checkpoint and the command that started it, with
``--resume_from_checkpoint`` pointing there.

The command is the one the user typed when the run came from ``trl-multiagent train`` (which hands it to the recipe in
``COMMAND_VARIABLE``), else this process's own (``python script.py ...``; under a launcher, its script and flags).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence

from .atomic import newest_complete_checkpoint

# the `trl-multiagent train ...` command line, shell-quoted (cli/commands.py)
COMMAND_VARIABLE = "TRL_MULTIAGENT_COMMAND"
_FLAG = "--resume_from_checkpoint"


def with_resume_flag(argv: Sequence[str], checkpoint: str | None) -> list[str]:
    """``argv`` without any resume flag it had, then ``--resume_from_checkpoint checkpoint`` (none when None)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == _FLAG:
            skip = True
        elif not arg.startswith(f"{_FLAG}="):
            kept.append(arg)
    return kept if checkpoint is None else [*kept, _FLAG, checkpoint]


def resume_advice(output_dir: str, flags: Sequence[str] = ()) -> str:
    """One sentence: the run's newest complete checkpoint and the exact command that resumes from it, ``flags``
    added after the resume flag (with no complete checkpoint yet, the command that starts the run again)."""
    checkpoint, _ = newest_complete_checkpoint(output_dir)
    typed = os.environ.get(COMMAND_VARIABLE)
    if typed:
        argv, note = shlex.split(typed), ""
    elif "LOCAL_RANK" in os.environ:  # one of several processes: the user typed a launcher before this
        argv, note = sys.argv, ", after the launcher that started this run (`accelerate launch ...`, `torchrun ...`)"
    else:
        argv, note = [sys.executable, *sys.argv], ""
    command = shlex.join([*with_resume_flag(argv, checkpoint), *flags])
    if checkpoint is None:
        return f"{output_dir} holds no complete checkpoint yet: start the run again with `{command}`{note}."
    in_python = "" if typed else f' (from Python: `trainer.train(resume_from_checkpoint="{checkpoint}")`)'
    return f"The run's newest complete checkpoint is {checkpoint}: resume from it with `{command}`{note}{in_python}."
