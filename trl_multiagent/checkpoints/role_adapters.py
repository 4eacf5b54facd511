"""What a run saves beside TRL's checkpoint, and resuming the role adapters from one.

Each role adapter lands in its own sub-folder (PEFT's layout for named adapters), those of every base model alike
(adapter names are unique across bases); next to them, ``multiagent_config.json`` holds what it takes to rebuild the
workflow that trained them (with ``role_models``: which base each role and adapter sits on), and
``coherence_state.pt`` the state of the adapters' update schedule (the coherence EMA) when there is one, and
``role_entropy_control.json`` each role's adaptive entropy coefficient (``use_adaptive_entropy``; TRL writes its one
controller to ``entropy_ctrl_state.json``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence

import torch

from ..adapters.routing import unique_adapters
from ..common.model_names import model_name
from .load import CONFIG_NAME
from .workflow_config import workflow_config

UPDATE_STATE_NAME = "coherence_state.pt"
ENTROPY_CONTROL_NAME = "role_entropy_control.json"


def run_config(
    base_model: str, workflow, policy_sharing: str, role_adapters: dict[str, str], role_models=None
) -> dict:
    """The content of ``multiagent_config.json``: the base model (``"toy"`` for the packaged one, wherever it is
    installed), the workflow's record (``workflow_config``: its ``config_dict()`` and its class's import path), the
    policy sharing and the role-to-adapter mapping; with roles on several bases (a ``RoleModels``), ``role_models``
    (role -> base) and ``adapter_models`` (adapter -> base) for the roles and adapters that are not on
    ``base_model``."""
    config = {
        "base_model": model_name(base_model),
        "workflow": workflow_config(workflow),
        "policy_sharing": policy_sharing,
        "role_to_adapter": dict(role_adapters),
        "adapters": unique_adapters(role_adapters),
    }
    if role_models is not None and role_models.extra:
        config["role_models"] = role_models.saved_mapping()
        config["adapter_models"] = {
            adapter: model_name(base) for adapter, base in role_models.adapter_base.items() if base != role_models.main
        }
    return config


def save_run_files(output_dir: str, config: dict, shadows: Sequence[str], bases: dict | None = None) -> None:
    """Write ``multiagent_config.json``, every other base's adapters (``bases``: base -> (PEFT model, adapters), the
    trainer's own first, which the Trainer saved), and drop the folders PEFT wrote for shadow adapters."""
    for model, adapters in list((bases or {}).values())[1:]:
        model.save_pretrained(output_dir, selected_adapters=adapters)
    for shadow in shadows:
        shutil.rmtree(os.path.join(output_dir, shadow), ignore_errors=True)
    with open(os.path.join(output_dir, CONFIG_NAME), "w") as f:
        json.dump(config, f, indent=2)


def load_role_adapters(peft_model, checkpoint: str, adapter_names: Sequence[str]) -> None:
    """Load every role adapter's weights from its sub-folder of ``checkpoint``.

    The Trainer's PEFT resume reloads only the active adapter from the checkpoint root (and leaves the others
    frozen), so each adapter is read from its own folder here.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    for adapter in adapter_names:
        path = os.path.join(checkpoint, adapter, "adapter_model.safetensors")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{checkpoint} has no weights for adapter {adapter!r} (expected {path}). Resume with the same "
                "workflow and policy sharing as the run that wrote the checkpoint."
            )
        set_peft_model_state_dict(peft_model, load_file(path), adapter_name=adapter)


def save_update_state(checkpoint: str, state: dict | None) -> None:
    if state is not None:
        torch.save(state, os.path.join(checkpoint, UPDATE_STATE_NAME))


def load_update_state(checkpoint: str | None) -> dict | None:
    path = os.path.join(checkpoint, UPDATE_STATE_NAME) if checkpoint else None
    return torch.load(path) if path and os.path.isfile(path) else None


def save_entropy_control(checkpoint: str, state: dict) -> None:
    with open(os.path.join(checkpoint, ENTROPY_CONTROL_NAME), "w") as f:
        json.dump(state, f)  # an entropy not measured yet is inf, which Python's json writes as Infinity


def load_entropy_control(checkpoint: str | None) -> dict | None:
    """The saved controllers, or None (no checkpoint, or one saved without adaptive entropy control, as TRL does)."""
    path = os.path.join(checkpoint, ENTROPY_CONTROL_NAME) if checkpoint else None
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)
