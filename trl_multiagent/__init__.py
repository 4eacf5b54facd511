"""trl-multiagent: train every role of a multi-agent LLM workflow with GRPO, on top of TRL."""

from .config import MultiAgentGRPOConfig
from .trainer import MultiAgentGRPOTrainer
from .workflows import EvalOpt, OrchWorkers, SingleAgent, Voting, Workflow

__all__ = [
    "EvalOpt",
    "MultiAgentGRPOConfig",
    "MultiAgentGRPOTrainer",
    "OrchWorkers",
    "SingleAgent",
    "Voting",
    "Workflow",
]
__version__ = "0.1.0"
