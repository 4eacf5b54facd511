"""Multi-agent workflows: what roles say to each other. Built-ins follow the paper; subclass ``Workflow`` for more."""

# The two readers a workflow of one's own usually needs; every rule is in trl_multiagent.common.parse_rules.
from ..common.deprecation import moved_names
from ..common.parse_rules import last_boxed, last_code_block
from .base import Generate, Messages, Workflow, problem_text, request_text
from .eval_opt import EvalOpt
from .formats import BoxedAnswer, CodeAnswer, OutputFormat, Selection, Strategies, Verdict
from .orch_workers import OrchWorkers
from .prompt_set import PromptSet
from .prompts import PROMPT_SETS
from .reward_policy import RoleRewardPolicy
from .single_agent import SingleAgent
from .voting import Voting

__all__ = [
    "PROMPT_SETS",
    "BoxedAnswer",
    "CodeAnswer",
    "EvalOpt",
    "Generate",
    "Messages",
    "OrchWorkers",
    "OutputFormat",
    "PromptSet",
    "RoleRewardPolicy",
    "Selection",
    "SingleAgent",
    "Strategies",
    "Verdict",
    "Voting",
    "Workflow",
    "last_boxed",
    "last_code_block",
    "problem_text",
    "request_text",
]

# The other readers moved to trl_multiagent.common.parse_rules (shared with the tasks): the old names still work until
# they are removed, with a warning.
__getattr__ = moved_names(__name__)
