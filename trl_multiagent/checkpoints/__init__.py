"""Checkpoints: what a run saves beside TRL's, resuming role adapters, loading a trained workflow, model cards.

Loading and saving only: running a loaded workflow (backends, generation settings, episodes) is
``trl_multiagent.evaluation``'s.
"""

from ..common.deprecation import moved_names
from .load import CONFIG_NAME, TrainedWorkflow, load_base_workflow, load_trained_workflow, read_multiagent_config
from .workflow_config import BUILT_IN_WORKFLOWS, check_workflow_config, workflow_from_config

__all__ = [
    "BUILT_IN_WORKFLOWS",
    "CONFIG_NAME",
    "TrainedWorkflow",
    "check_workflow_config",
    "load_base_workflow",
    "load_trained_workflow",
    "read_multiagent_config",
    "workflow_from_config",
]

# Names that moved out of this package still work until they are removed, with a warning (deprecation.MOVED).
__getattr__ = moved_names(__name__)
