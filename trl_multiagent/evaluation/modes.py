"""What is evaluated: which workflow runs, and which adapter (or the base model) answers for each of its roles.

- ``base``: the untrained base model in every role (each role routed to ``"__base__"``);
- ``trained``: the checkpoint's own workflow and adapters;
- ``transfer``: a checkpoint holding one adapter (a single-agent run, SA-RL) plugged into every role of ``workflow``
  ("SA-RL in the same structure");
- ``generator_alone``: one role's trained adapter of a workflow run, evaluated alone with ``SingleAgent``.

In ``trained`` mode, ``role_policies`` mixes trained and untrained roles: role type -> ``"trained"`` (the run's own
adapter, the default), ``"base"`` (no adapter: the role's calls go to the base model, ``"__base__"``) or another
checkpoint folder (the adapter that served the same role there, e.g. ``runs/other/checkpoint-500``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

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
    role_policies: dict[str, str] = field(default_factory=dict)  # roles not "trained" -> "base" or a folder
    adapter_folders: dict[str, str] = field(default_factory=dict)  # adapters from other checkpoints -> their folder

    def load(self, device: str = "cpu", dtype: str | torch.dtype | None = None) -> TrainedWorkflow:
        if self.checkpoint is None:
            return load_base_workflow(self.model, self.workflow, device, dtype)
        return load_trained_workflow(
            self.checkpoint,
            self.workflow,
            self.role_to_adapter,
            self.model,
            device=device,
            dtype=dtype,
            adapter_folders=self.adapter_folders,
        )


def plan_mode(
    mode: str,
    checkpoint: str | None = None,
    workflow: Workflow | None = None,
    base_model: str | None = None,
    alone_role: str = "generator",
    role_policies: dict[str, str] | None = None,
) -> ModePlan:
    """Resolve ``mode`` against a checkpoint's ``multiagent_config.json``; see the module docstring for the modes.

    ``workflow`` overrides the checkpoint's workflow (required for ``transfer``, and for ``base`` without a
    checkpoint); ``base_model`` overrides the checkpoint's base model (required for ``base`` without a checkpoint).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if role_policies and mode != "trained":
        raise ValueError(
            f"role_policies mixes a run's trained roles with base ones; it needs mode 'trained', got {mode!r}."
        )
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
        if role_policies:
            policies = {role: p for role, p in check_role_policies(role_policies, workflow).items() if p != "trained"}
            mapping, folders = apply_role_policies(mapping, policies, model)
            sharing = config["policy_sharing"]
            return ModePlan(mode, workflow, mapping, model, sharing, trained_in, str(checkpoint), policies, folders)
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


def parse_role_policies(entries: list[str] | dict[str, str] | None) -> dict[str, str]:
    """``["evaluator=base", "generator=runs/x/checkpoint-5"]`` (the command line's form) -> a dict; a dict as is."""
    if not entries:
        return {}
    if isinstance(entries, dict):
        return dict(entries)
    pairs = [entry.split("=", 1) for entry in entries]
    bad = [entry for entry, pair in zip(entries, pairs) if len(pair) != 2 or not pair[0] or not pair[1]]
    if bad:
        raise ValueError(
            f"role_policies entries look like role=base, role=trained or role=path/to/checkpoint; got {bad}."
        )
    return dict(pairs)


def check_role_policies(role_policies: dict[str, str], workflow: Workflow) -> dict[str, str]:
    """Every named role is one of the workflow's and every policy is 'trained', 'base' or an existing folder."""
    unknown = sorted(set(role_policies) - set(workflow.roles))
    if unknown:
        raise ValueError(
            f"role_policies names role(s) {unknown}; {type(workflow).__name__}'s roles are {list(workflow.roles)}."
        )
    for role, policy in role_policies.items():
        if policy not in ("trained", "base") and not Path(policy).is_dir():
            raise ValueError(
                f"role_policies[{role!r}] = {policy!r} is neither 'trained', 'base' nor a checkpoint folder "
                "(e.g. runs/other/checkpoint-500)."
            )
    return dict(role_policies)


def apply_role_policies(
    mapping: dict[str, str], policies: dict[str, str], base_model: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The run's role-to-adapter mapping with ``policies`` applied, and the folder of every adapter taken from
    another checkpoint (named ``<adapter>-<hash of its folder>``, so that it never shadows one of the run's)."""
    mapping, folders = dict(mapping), {}
    for role, policy in policies.items():
        if policy == "base":
            mapping[role] = BASE_MODEL
            continue
        other = read_multiagent_config(policy)
        if role not in other["role_to_adapter"]:
            raise ValueError(
                f"{policy} has no role {role!r} (its roles: {list(other['role_to_adapter'])}); name a checkpoint "
                "of a run whose workflow has that role."
            )
        if other["base_model"] != base_model:
            raise ValueError(
                f"{policy} was trained on {other['base_model']!r}, this run on {base_model!r}: an adapter only "
                "fits the base model it was trained on."
            )
        adapter = other["role_to_adapter"][role]
        folder = str(Path(policy).resolve())
        name = f"{adapter}-{hashlib.sha1(folder.encode()).hexdigest()[:8]}"
        mapping[role], folders[name] = name, str(Path(folder) / adapter)
    return mapping, folders


def _all_roles(workflow: Workflow, adapter: str) -> dict[str, str]:
    return {role: adapter for role in workflow.roles}
