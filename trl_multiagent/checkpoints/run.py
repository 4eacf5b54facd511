"""``RunCheckpoints``: what the trainer writes beside TRL's checkpoint and reads back on resume, from what it owns.

The trainer's checkpoint hooks (saving a checkpoint or the final model, resuming, writing model cards) each call one
method here; this class gets the run's parts it needs (the workflow, the role adapters, the bases they sit on, the
update state, the entropy control), never the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..workflows.base import Workflow
from . import role_adapters as saved_run
from .card import final_metrics, write_model_cards


class RunCheckpoints:
    """Save and resume a run's role adapters, its ``multiagent_config.json``, update state and model cards.

    Args:
        workflow: the workflow being trained (its record goes to ``multiagent_config.json``).
        role_adapters: role -> adapter name.
        policy_sharing: ``"isolated"`` or ``"shared"``, as configured.
        bases: the ``adapters.bases.Bases`` the roles sit on (gathered under ZeRO-3 while adapters are read or
            written).
        installed: the ``adapters.installed.InstalledAdapters``: each base's adapters and the role shadows.
        update_state: what holds the adapters' update schedule state (``state_dict`` / ``load_state_dict``: the
            gradient accounts' coherence EMA).
        entropy_control: each role's adaptive entropy coefficient (``state_dict`` / ``load_state_dict``;
            training/entropy_control.py), saved as ``role_entropy_control.json``; None without `use_adaptive_entropy`.
    """

    def __init__(
        self,
        workflow: Workflow,
        role_adapters: Mapping[str, str],
        *,
        policy_sharing: str,
        bases: Any,
        installed: Any,
        update_state: Any,
        entropy_control: Any = None,
    ):
        self.workflow, self.role_adapters, self.policy_sharing = workflow, dict(role_adapters), policy_sharing
        self.bases, self.installed, self.update_state = bases, installed, update_state
        self.entropy_control = entropy_control

    def run_config(self, peft_model) -> dict:
        """The content of ``multiagent_config.json`` for a run whose trainer's model is ``peft_model``."""
        base_model = next(iter(peft_model.peft_config.values())).base_model_name_or_path
        return saved_run.run_config(base_model, self.workflow, self.policy_sharing, self.role_adapters, self.bases)

    def save_update_state(self, checkpoint: str) -> None:
        """The update schedule's state into ``checkpoint`` (nothing when the schedule keeps none), and the entropy
        control's."""
        saved_run.save_update_state(checkpoint, self.update_state.state_dict())
        if self.entropy_control is not None:
            saved_run.save_entropy_control(checkpoint, self.entropy_control.state_dict())

    def save_run_files(self, output_dir: str, peft_model, *, should_save: bool, log_history: list, hub_model_id):
        """Beside the model files the Trainer wrote: every other base's adapters (gathered whole under ZeRO-3, on
        every process), ``multiagent_config.json`` and the model cards (on the process that saves)."""
        with self.bases.gathered():
            if should_save:
                config = self.run_config(peft_model)
                saved_run.save_run_files(
                    output_dir, config, self.installed.shadows, self.installed.by_base(peft_model)
                )
                write_model_cards(output_dir, config, final_metrics(log_history), hub_model_id)

    def write_cards(self, output_dir: str, peft_model, *, log_history: list, hub_model_id, dataset_name, tags) -> None:
        """The run's model card and one per adapter folder (instead of TRL's, which names transformers)."""
        config = self.run_config(peft_model)
        write_model_cards(output_dir, config, final_metrics(log_history), hub_model_id, dataset_name, tags)

    def load_adapters(self, peft_model, checkpoint: str) -> None:
        """Every role adapter, on every base, from its own folder of ``checkpoint`` (the Trainer's PEFT resume reloads
        the active adapter only)."""
        for model, names in self.installed.by_base(peft_model).values():
            saved_run.load_role_adapters(model, checkpoint, names)
        self.installed.weights_loaded()

    def restore(self, checkpoint: str | None, peft_model, *, deepspeed: bool) -> None:
        """After the optimizer and scheduler came back: under DeepSpeed, the other bases' adapters (the engine
        restored the trainer's model's state dict only, which leaves out the other bases it holds); then the update
        schedule's state and the entropy control's."""
        if checkpoint is not None and deepspeed and self.bases.extra:
            with self.bases.gathered(modifier_rank=0):
                for model, names in list(self.installed.by_base(peft_model).values())[1:]:
                    saved_run.load_role_adapters(model, checkpoint, names)
            self.installed.weights_loaded()
        state = saved_run.load_update_state(checkpoint)
        if state is not None:
            self.update_state.load_state_dict(state)
        saved = saved_run.load_entropy_control(checkpoint) if self.entropy_control is not None else None
        if saved is not None:
            self.entropy_control.load_state_dict(saved)
