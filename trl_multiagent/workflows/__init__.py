"""Multi-agent workflows: what roles say to each other. Built-ins follow the paper; subclass ``Workflow`` for more."""

from .base import Generate, Messages, Workflow, problem_text
from .eval_opt import EvalOpt
from .orch_workers import OrchWorkers
from .parsing import (
    last_boxed,
    last_code_block,
    parse_selection,
    parse_strategies,
    parse_verdict,
)
from .single_agent import SingleAgent
from .voting import Voting

__all__ = [
    "EvalOpt",
    "Generate",
    "Messages",
    "OrchWorkers",
    "SingleAgent",
    "Voting",
    "Workflow",
    "last_boxed",
    "last_code_block",
    "parse_selection",
    "parse_strategies",
    "parse_verdict",
    "problem_text",
]
