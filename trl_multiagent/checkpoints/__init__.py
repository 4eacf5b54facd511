"""Checkpoints: what a run saves beside TRL's, resuming role adapters, loading a trained workflow, model cards.

Loading and saving only: running a loaded workflow (backends, generation settings, episodes) is
``trl_multiagent.evaluation``'s.
"""

from .load import (
    BUILT_IN_WORKFLOWS,
    CONFIG_NAME,
    TrainedWorkflow,
    load_base_workflow,
    load_trained_workflow,
    read_multiagent_config,
    workflow_from_config,
)

__all__ = [
    "BUILT_IN_WORKFLOWS",
    "CONFIG_NAME",
    "TrainedWorkflow",
    "load_base_workflow",
    "load_trained_workflow",
    "read_multiagent_config",
    "workflow_from_config",
]
