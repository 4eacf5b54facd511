"""What every built-in workflow takes, declared once: the task and the prompt set, and for those with a judge or a
planner, how its output is read.

The built-in workflows are keyword-only dataclasses on these bases: each declares only the options of its own
(``EvalOpt``'s ``max_iterations`` and ``history``, ...) and checks them in ``__post_init__`` before the base resolves
the task's prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.parse_rules import check_rule
from .base import Workflow
from .prompt_set import PromptSet
from .prompts import check_task, resolve


@dataclass(kw_only=True, eq=False)
class BuiltInWorkflow(Workflow):
    """``task``: ``"math"`` or ``"code"``, which selects the built-in prompts and the answer format. ``prompts``: a
    prompt set, ``"paper"``, ``"guarded"``, a JSON file in the reference's ``prompt.json`` layout, or a ``PromptSet``
    (see ``prompt_set.py``); recorded by name, or by its templates when given as a file or an object."""

    task: str = "math"
    prompts: str | dict[str, Any] | PromptSet = "paper"

    def __post_init__(self) -> None:
        self.task = check_task(self.task)
        self._prompts, self.prompts = resolve(self.prompts, self.task)


@dataclass(kw_only=True, eq=False)
class ReadWorkflow(BuiltInWorkflow):
    """A built-in workflow one of whose roles writes what the workflow reads and acts on (a verdict, a selection, a
    plan); ``parsing``: the reader, ``"reference"`` (the reference's) or ``"robust"`` (``parse_rules.RULES``)."""

    parsing: str = "reference"

    def __post_init__(self) -> None:
        self.parsing = check_rule(self.parsing)
        super().__post_init__()
