"""Rebuild a trained workflow from a checkpoint folder: its base model(s), role adapters, tokenizer(s) and workflow.

A checkpoint (``run_dir/checkpoint-N`` or the final ``run_dir``) holds one sub-folder per role adapter and
``multiagent_config.json``: the base model, the workflow's ``config_dict()``, the policy sharing and the
role-to-adapter mapping (and, for a run with roles on several base models, ``adapter_models``: the base of every
adapter not on ``base_model``; each base is loaded once, with its own tokenizer). ``load_trained_workflow`` reads
them back; ``trl_multiagent.evaluation.run_episodes`` runs the result with the engine, backend and routing the
trainer uses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..adapters.routing import BASE_MODEL, AdapterRouter, unique_adapters
from ..common.model_names import resolve_model_name
from ..workflows import Workflow
from .workflow_config import workflow_from_config

CONFIG_NAME = "multiagent_config.json"


@dataclass
class TrainedWorkflow:
    """A workflow with the model behind its roles, ready for ``trl_multiagent.evaluation.run_episodes``."""

    workflow: Workflow
    model: torch.nn.Module  # a PeftModel holding every routed adapter under its name; the bare model in base mode
    tokenizer: Any
    role_to_adapter: dict[str, str]  # role type -> adapter name, or "__base__" (no adapter)
    config: dict[str, Any]  # the checkpoint's multiagent_config.json ({} in base mode without a checkpoint)
    router: Any  # AdapterRouter over the model's LoRA layers (or a stand-in that allows only "__base__")
    # Roles on other base models (`role_models`): role type -> base name, and each such base by name
    role_bases: dict[str, str] = field(default_factory=dict)
    bases: dict[str, LoadedBase] = field(default_factory=dict)


@dataclass
class LoadedBase:
    """Another base model of a run whose roles sit on several: its model with its adapters, tokenizer and router."""

    model: torch.nn.Module
    tokenizer: Any
    router: Any


class _BaseOnlyRouter:
    """Stands in for ``AdapterRouter`` on a model without LoRA layers: every request must go to the base model."""

    @contextmanager
    def route(self, names: Sequence[str]) -> Iterator[None]:
        unknown = sorted(set(names) - {BASE_MODEL})
        if unknown:
            raise ValueError(f"The model has no adapters, but requests were routed to {unknown}.")
        yield


def read_multiagent_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``multiagent_config.json`` of a checkpoint folder (written by ``MultiAgentGRPOTrainer._save``)."""
    file = Path(path) / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} has no {CONFIG_NAME}. Pass a folder saved by MultiAgentGRPOTrainer: a run's output_dir or one "
            "of its checkpoint-N folders."
        )
    return json.loads(file.read_text())


def load_trained_workflow(
    path: str | os.PathLike,
    workflow: Workflow | None = None,
    role_to_adapter: dict[str, str] | None = None,
    base_model: str | None = None,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    adapter_folders: dict[str, str] | None = None,
) -> TrainedWorkflow:
    """Load a checkpoint's base model and role adapters and rebuild its workflow.

    Args:
        path: a checkpoint folder (``run_dir/checkpoint-N``) or a run's final ``output_dir``.
        workflow: the workflow to run; defaults to the saved one, rebuilt from its class's import path
            (``workflow_config.py``; pass a workflow here when its class cannot be imported). Any workflow works as
            long as ``role_to_adapter`` routes each of its roles.
        role_to_adapter: role type -> saved adapter name; defaults to the saved mapping.
        base_model: overrides the saved base model (e.g. a local copy of the Hub model).
        device, dtype: where and in which precision to load (``dtype=None`` keeps the checkpoint's own).
        adapter_folders: adapter name -> the folder it is loaded from, for adapters ``role_to_adapter`` takes from
            elsewhere than ``path`` (another run's checkpoint, on the same base model); the rest come from ``path``.
    """
    config = read_multiagent_config(path)
    workflow = workflow if workflow is not None else workflow_from_config(config["workflow"])
    mapping = dict(role_to_adapter or config["role_to_adapter"])
    missing = [role for role in workflow.roles if role not in mapping]
    if missing:
        raise ValueError(
            f"No adapter for role(s) {missing} of {type(workflow).__name__}: the mapping is {mapping}. Pass "
            f"role_to_adapter= naming one of the saved adapters {config['adapters']} for every role."
        )
    mapping = {role: mapping[role] for role in workflow.roles}
    adapters = [name for name in unique_adapters(mapping) if name != BASE_MODEL]
    folders = {adapter: Path(path) / adapter for adapter in adapters} | {
        name: Path(folder) for name, folder in (adapter_folders or {}).items()
    }
    for adapter in adapters:
        if not (folders[adapter] / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{folders[adapter]} holds no adapter; {path} holds {config['adapters']}.")
    on_base = config.get("adapter_models", {})  # adapters on other base models than base_model
    other = {on_base[a] for a in adapters if a in on_base}
    if BASE_MODEL in mapping.values() and other:
        raise ValueError(f"A role routed to {BASE_MODEL!r} has no base of its own in a run on several bases.")

    base_source = resolve_model_name(base_model or config["base_model"])  # "toy" -> the packaged folder
    model, router = _with_adapters(
        _load_base(base_source, device, dtype), {a: folders[a] for a in adapters if a not in on_base}
    )
    has_tokenizer = (Path(path) / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(path) if has_tokenizer else base_source)
    bases = {}
    for name in sorted(other):
        source = resolve_model_name(name)
        extra, extra_router = _with_adapters(
            _load_base(source, device, dtype), {a: folders[a] for a in adapters if on_base.get(a) == name}
        )
        bases[name] = LoadedBase(extra, AutoTokenizer.from_pretrained(source), extra_router)
    role_bases = {role: on_base[a] for role, a in mapping.items() if a in on_base}
    return TrainedWorkflow(workflow, model, tokenizer, mapping, config, router, role_bases, bases)


def _with_adapters(model: torch.nn.Module, folders: dict[str, Path]) -> tuple[torch.nn.Module, Any]:
    """``model`` with each saved adapter (name -> folder) loaded under its name (in eval mode), and its router."""
    from peft import PeftModel

    if not folders:
        return model.eval(), _BaseOnlyRouter()
    (first, first_folder), *rest = folders.items()
    model = PeftModel.from_pretrained(model, str(first_folder), adapter_name=first)
    for adapter, folder in rest:
        model.load_adapter(str(folder), adapter_name=adapter)
    return model.eval(), AdapterRouter(model)


def load_base_workflow(
    base_model: str,
    workflow: Workflow,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    role_models: dict[str, str] | None = None,
) -> TrainedWorkflow:
    """The untrained base model behind every role of ``workflow`` (each role routed to ``"__base__"``);
    ``role_models`` (role type -> model) puts roles on other untrained bases, as the training option does."""
    unknown = sorted(set(role_models or {}) - set(workflow.roles))
    if unknown:
        raise ValueError(f"`role_models` names role(s) {unknown}; the workflow's roles are {list(workflow.roles)}.")
    source = resolve_model_name(base_model)  # "toy" -> the packaged folder
    model = _load_base(source, device, dtype).eval()
    mapping = {role: BASE_MODEL for role in workflow.roles}
    config = {"base_model": base_model, "workflow": workflow.config_dict(), "policy_sharing": None}
    role_bases = {role: name for role, name in (role_models or {}).items() if name != base_model}
    bases = {}
    for name in dict.fromkeys(role_bases.values()):
        other = resolve_model_name(name)
        bases[name] = LoadedBase(
            _load_base(other, device, dtype).eval(), AutoTokenizer.from_pretrained(other), _BaseOnlyRouter()
        )
    tokenizer = AutoTokenizer.from_pretrained(source)
    return TrainedWorkflow(workflow, model, tokenizer, mapping, config, _BaseOnlyRouter(), role_bases, bases)


def _load_base(name: str, device: str, dtype: str | torch.dtype | None) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(name, dtype=dtype if dtype is not None else "auto").to(device)
