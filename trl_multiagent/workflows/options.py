"""``WorkflowOptions``: what the roles of the built-in workflows see, as parser arguments for the recipes.

Each option's default is the one the workflows' constructors give it (read from their signatures, which must agree),
its choices the ones they check it against; the presets in ``recipes/configs/`` set these fields like any other
(``paper_math.yaml``: the defaults; ``toy.yaml``: the requests the toy model was trained on), and one preset serves
every recipe: each workflow takes the options it has (`for_workflow`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from typing import Any

from ..common.parse_rules import RULES
from .eval_opt import HISTORIES, EvalOpt
from .orch_workers import WORKER_COUNTS, OrchWorkers
from .single_agent import TEMPLATES, SingleAgent
from .voting import Voting

BUILT_IN = (EvalOpt, Voting, OrchWorkers, SingleAgent)
# What each constructor checks an option against (`prompts` also takes a prompt file: no fixed list).
CHOICES = {"parsing": RULES, "history": HISTORIES, "workers": WORKER_COUNTS, "template": TEMPLATES}


def workflow_option(name: str, help: str) -> Any:
    """The field of the built-in workflows' constructor argument ``name``: their default and choices, and ``help``
    followed by the workflows that take it."""
    takers = [cls for cls in BUILT_IN if name in inspect.signature(cls).parameters]
    defaults = {cls.__name__: inspect.signature(cls).parameters[name].default for cls in takers}
    if len(set(defaults.values())) != 1:
        raise TypeError(f"The built-in workflows' constructors disagree on the default of {name!r}: {defaults}.")
    metadata = {"help": f"{help} Taken by {', '.join(defaults)}."}
    if name in CHOICES:
        metadata["choices"] = list(CHOICES[name])
    return field(default=next(iter(defaults.values())), metadata=metadata)


@dataclass
class WorkflowOptions:
    """Options of the built-in workflows (`EvalOpt`, `Voting`, `OrchWorkers`, `SingleAgent`); a workflow takes those
    its constructor has, so a preset shared by every recipe may set them all."""

    prompts: str = workflow_option(
        "prompts",
        "Prompt set of every role: 'paper' (the research's), 'guarded' (the requests the shipped toy model was "
        "trained on), or a JSON file in the reference's prompt.json layout.",
    )
    parsing: str = workflow_option(
        "parsing",
        "How judges' outputs are read: 'reference' (the reference's readers of verdicts, selections and strategy "
        "lines) or 'robust' (the last box).",
    )
    history: str = workflow_option(
        "history",
        "EvalOpt's conversation: 'shared' (one conversation, the paper's) or 'fresh' (a new evaluator chat per "
        "attempt).",
    )
    workers: str = workflow_option(
        "workers",
        "OrchWorkers' workers: 'per_strategy' (one per strategy read, the paper's) or 'fixed' (always n_workers).",
    )
    template: str = workflow_option(
        "template",
        "SingleAgent's request: 'generator' (the workflows' generator request, the paper's SA-RL) or 'raw' (the "
        "dataset prompt, as plain TRL GRPO).",
    )

    def for_workflow(self, workflow_class: type) -> dict[str, Any]:
        """The options ``workflow_class``'s constructor takes, as keyword arguments."""
        accepted = inspect.signature(workflow_class).parameters
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in accepted}
