"""Checkpoints: what a run saves beside TRL's, resuming role adapters, rebuilding a trained workflow, model cards."""

from .load import (
    BUILT_IN_WORKFLOWS,
    CONFIG_NAME,
    TrainedWorkflow,
    eos_token_ids,
    load_base_workflow,
    load_trained_workflow,
    make_generation_config,
    read_multiagent_config,
    run_episodes,
    workflow_from_config,
)

__all__ = [
    "BUILT_IN_WORKFLOWS",
    "CONFIG_NAME",
    "TrainedWorkflow",
    "eos_token_ids",
    "load_base_workflow",
    "load_trained_workflow",
    "make_generation_config",
    "read_multiagent_config",
    "run_episodes",
    "workflow_from_config",
]
