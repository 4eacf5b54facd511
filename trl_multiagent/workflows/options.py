"""``WorkflowOptions``: what the roles of the built-in workflows see, as parser arguments for the recipes.

The defaults are the workflows' own, the research's reference workflows. The presets in ``recipes/configs/`` set
these fields like any other (``paper_math.yaml``: the defaults; ``toy.yaml``: the requests the toy model was trained
on), and one preset serves every recipe: each workflow takes the options it has (`for_workflow`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from typing import Any

from ..parse_rules import RULES
from .eval_opt import HISTORIES
from .orch_workers import WORKER_COUNTS
from .single_agent import TEMPLATES


@dataclass
class WorkflowOptions:
    """Options of the built-in workflows (`EvalOpt`, `Voting`, `OrchWorkers`, `SingleAgent`); a workflow takes those
    its constructor has, so a preset shared by every recipe may set them all."""

    prompts: str = field(
        default="paper",
        metadata={
            "help": "Prompt set of every role: 'paper' (the research's), 'guarded' (the requests the shipped toy "
            "model was trained on), or a JSON file in the reference's prompt.json layout. Every built-in workflow."
        },
    )
    parsing: str = field(
        default="reference",
        metadata={
            "help": "How judges' outputs are read: 'reference' (the reference's readers of verdicts, selections and "
            "strategy lines) or 'robust' (the last box). EvalOpt, Voting, OrchWorkers.",
            "choices": list(RULES),
        },
    )
    history: str = field(
        default="shared",
        metadata={
            "help": "EvalOpt's conversation: 'shared' (one conversation, the paper's) or 'fresh' (a new evaluator "
            "chat per attempt).",
            "choices": list(HISTORIES),
        },
    )
    workers: str = field(
        default="per_strategy",
        metadata={
            "help": "OrchWorkers' workers: 'per_strategy' (one per strategy read, the paper's) or 'fixed' (always "
            "n_workers).",
            "choices": list(WORKER_COUNTS),
        },
    )
    template: str = field(
        default="generator",
        metadata={
            "help": "SingleAgent's request: 'generator' (the workflows' generator request, the paper's SA-RL) or "
            "'raw' (the dataset prompt, as plain TRL GRPO).",
            "choices": list(TEMPLATES),
        },
    )

    def for_workflow(self, workflow_class: type) -> dict[str, Any]:
        """The options ``workflow_class``'s constructor takes, as keyword arguments."""
        accepted = inspect.signature(workflow_class).parameters
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in accepted}
