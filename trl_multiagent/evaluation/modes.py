"""What is evaluated: which workflow runs, and which adapter (or the base model) answers for each of its roles.

- ``base``: the untrained base model in every role (each role routed to ``"__base__"``);
- ``trained``: the checkpoint's own workflow and adapters;
- ``transfer``: a checkpoint holding one adapter (a single-agent run, SA-RL) plugged into every role of ``workflow``
  ("SA-RL in the same structure");
- ``generator_alone``: one role's trained adapter of a workflow run, evaluated alone with ``SingleAgent``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..adapters.routing import BASE_MODEL
from ..checkpoints import (
    TrainedWorkflow,
    load_base_workflow,
    load_trained_workflow,
    read_multiagent_config,
    workflow_from_config,
)
from ..workflows import SingleAgent, Workflow

MODES = ("base", "trained", "transfer", "generator_alone")


@dataclass
class ModePlan:
    """Everything an evaluation records about what it runs, known before any weight is loaded."""

    mode: str
    workflow: Workflow
    role_to_adapter: dict[str, str]
    model: str  # the base model
    policy_sharing: str | None  # of the run that trained the adapters; None in base mode
    trained_workflow: str | None  # name of the workflow the adapters were trained in; None in base mode
    checkpoint: str | None  # the folder adapters are loaded from; None in base mode

    def load(self, device: str = "cpu", dtype: str | torch.dtype | None = None) -> TrainedWorkflow:
        if self.checkpoint is None:
            return load_base_workflow(self.model, self.workflow, device, dtype)
        return load_trained_workflow(
            self.checkpoint, self.workflow, self.role_to_adapter, self.model, device=device, dtype=dtype
        )


def plan_mode(
    mode: str,
    checkpoint: str | None = None,
    workflow: Workflow | None = None,
    base_model: str | None = None,
    alone_role: str = "generator",
) -> ModePlan:
    """Resolve ``mode`` against a checkpoint's ``multiagent_config.json``; see the module docstring for the modes.

    ``workflow`` overrides the checkpoint's workflow (required for ``transfer``, and for ``base`` without a
    checkpoint); ``base_model`` overrides the checkpoint's base model (required for ``base`` without a checkpoint).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if checkpoint is None:
        if mode != "base" or workflow is None or base_model is None:
            raise ValueError(
                f"Mode {mode!r} needs a checkpoint (a run dir); only 'base' runs without one, given both a workflow "
                "and a base model."
            )
        return ModePlan(mode, workflow, _all_roles(workflow, BASE_MODEL), base_model, None, None, None)
    config = read_multiagent_config(checkpoint)
    model = base_model or config["base_model"]
    trained_in = config["workflow"]["workflow"]
    if mode == "base":
        workflow = workflow or workflow_from_config(config["workflow"])
        return ModePlan(mode, workflow, _all_roles(workflow, BASE_MODEL), model, None, None, None)
    if mode == "trained":
        workflow = workflow or workflow_from_config(config["workflow"])
        mapping = dict(config["role_to_adapter"])
    elif mode == "transfer":
        if workflow is None:
            raise ValueError("Mode 'transfer' needs the workflow to plug the adapter into (workflow=, --workflow).")
        if len(config["adapters"]) != 1:
            raise ValueError(
                f"Mode 'transfer' plugs one adapter into every role, but {checkpoint} holds {config['adapters']}. "
                "Use a single-agent (SA-RL) run, or a shared-policy run."
            )
        mapping = _all_roles(workflow, config["adapters"][0])
    else:
        if workflow is not None:
            raise ValueError("Mode 'generator_alone' always runs SingleAgent(); do not pass a workflow.")
        if alone_role not in config["role_to_adapter"]:
            raise ValueError(
                f"{checkpoint} has no role {alone_role!r} (roles: {list(config['role_to_adapter'])}); pass the role "
                "to evaluate alone with alone_role= (--alone_role), e.g. 'worker' for OrchWorkers."
            )
        # The role's adapter on the generator's first request of the run's own prompt set and task.
        trained = config["workflow"]
        workflow = SingleAgent(task=trained.get("task", "math"), prompts=trained.get("prompts", "paper"))
        mapping = {"generator": config["role_to_adapter"][alone_role]}
    return ModePlan(mode, workflow, mapping, model, config["policy_sharing"], trained_in, str(checkpoint))


def _all_roles(workflow: Workflow, adapter: str) -> dict[str, str]:
    return {role: adapter for role in workflow.roles}
