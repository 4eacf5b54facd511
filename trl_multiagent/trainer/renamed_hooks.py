"""The trainer's public names of 0.1.0 that became private: they keep working until ``REMOVED_IN``, with a warning.

In 0.1.0 the trainer's hooks over TRL's private ones (``generate_and_score``, ``prepare_inputs``, ...), its view of
TRL's state (``text_tokenizer``, ``micro_step``, ...) and most of the parts it is built from (``router``,
``rollouts``, ...) were public names; a subclass sees TRL's public API plus the trainer's eight documented attributes
now (docs/api/trainer.md). An old name still works: calling it, or reading or setting it, warns and uses
the private name that replaced it; a subclass that overrides an old method name warns when the class is made, and
its override is still the one the trainer calls.
"""

from __future__ import annotations

import warnings
from operator import attrgetter
from typing import Any

from ..common.deprecation import REMOVED_IN, warn_deprecated

TRAINER = "MultiAgentGRPOTrainer"

# old public method -> the private method that replaced it
RENAMED_METHODS = {
    "generate_and_score": "_generate_and_score",
    "prepare_inputs": "_micro_step_inputs",
    "per_token_logps_and_entropies": "_logps_and_entropies",
    "clip_grad_norm": "_clip_gradients",
    "gradient_norm": "_step_grad_norm",
    "save_checkpoint": "_write_checkpoint",
    "load_optimizer_and_scheduler": "_restore_optimizer_and_scheduler",
    "save_to": "_save_model_files",
    "load_from_checkpoint": "_load_model_weights",
    "accumulating": "_accumulating",
    "trl_loss": "_trl_loss",
    "checkpoint_folder": "_checkpoint_folder",
    "unwrapped_for_generation": "_unwrapped_for_generation",
    "score_completions": "_score_completions",
    "record_metrics": "_record_metrics",
    "record_completions": "_record_completions",
    "record_completion_column": "_record_completion_column",
    "backend_context": "_backend_context",
}
# old public attribute -> the private attribute that replaced it (a dotted name: an attribute of a part it holds)
RENAMED_ATTRIBUTES = {
    "text_tokenizer": "_text_tokenizer",
    "is_vision_language_model": "_is_vision_language_model",
    "micro_step": "_micro_step",
    "buffered_micro_batches": "_buffered_micro_batches",
    "environment_pool": "_environment_instances",
    "saving_aside": "_saving_aside",
    # The trainer's public attributes are the eight its API page documents; these became private.
    "adapter_check": "_adapter_check",
    "adapter_names": "_updates.installed.adapter_names",  # the adapters are `set(role_adapters.values())`
    "adapter_optimizer": "_updates.optimizer",
    "adapter_routing": "_updates.routing",
    "answer_checker": "_answer_checker",
    "earlier_update_norms": "_earlier_update_norms",
    "early_rewards": "_rollout.early_rewards",
    "environment_runs": "_rollout.environment_runs",
    "episode_tools": "_rollout.episode_tools",
    "gradient_accounts": "_updates.accounts",
    "installed_adapters": "_updates.installed",
    "learning_signal": "_monitoring.learning_signal",
    "process_alignment": "_updates.alignment",
    "role_tools": "_rollout.role_tools",
    "rollouts": "_rollout.rollouts",
    "router": "_updates.installed.router",  # which adapter serves which role: `role_adapters`
}
# The parts of the update the trainer's `adapters` (0.1.0's `AdapterUpdates`) held, each its own attribute now.
ADAPTER_PARTS = (
    "_updates.installed",
    "_updates.routing",
    "_updates.optimizer",
    "_updates.alignment",
    "_updates.accounts",
)


def _replacement(new: str) -> str:
    return f"`{TRAINER}.{new}`, now private (or TRL's public API, where it serves)"


def _implementation(cls: type, name: str):
    """The first ``name`` along ``cls``'s MRO that is not an old-name override routed there (``_routed``)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if found is not None and not getattr(found, "_routed", False):
            return found
    raise AttributeError(f"{cls.__name__} has no {name}")


def _method(old: str, new: str):
    def method(self, *args, **kwargs):
        warn_deprecated(f"{TRAINER}.{old}", _replacement(new))
        return _implementation(type(self), new)(self, *args, **kwargs)

    method.__name__ = old
    method.__doc__ = f"Deprecated: {TRAINER}.{new}, private. Removed in {REMOVED_IN}."
    return method


def _attribute(old: str, new: str) -> property:
    owner, _, name = new.rpartition(".")  # "_updates.installed": the part of the trainer that holds it now

    def get(self):
        warn_deprecated(f"{TRAINER}.{old}", _replacement(new))
        return attrgetter(new)(self)

    def set(self, value) -> None:
        warn_deprecated(f"{TRAINER}.{old}", _replacement(new))
        setattr(attrgetter(owner)(self) if owner else self, name, value)

    return property(get, set, doc=f"Deprecated: {TRAINER}.{new}, private. Removed in {REMOVED_IN}.")


class _AdapterParts:
    """0.1.0's ``trainer.adapters``: each name read from the part of the update that holds it now."""

    def __init__(self, trainer):
        self._parts = [attrgetter(part)(trainer) for part in ADAPTER_PARTS]

    def __getattr__(self, name: str) -> Any:
        for part in self._parts:
            if hasattr(part, name):
                return getattr(part, name)
        raise AttributeError(f"None of the trainer's {', '.join(ADAPTER_PARTS)} has {name!r}.")


class RenamedTrainerNames:
    """The old names on the trainer (its last base class: nothing of TRL's has these names)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED_METHODS.items():
            override = cls.__dict__.get(old)
            if override is None:
                continue
            warnings.warn(
                f"{cls.__name__}.{old} overrides a hook that {TRAINER} renamed `{new}`; override `{new}` instead. "
                f"The old name is still called until trl-multiagent {REMOVED_IN}, which removes it.",
                DeprecationWarning,
                stacklevel=2,
            )

            def routed(self, *args, _override=override, **kwargs):
                return _override(self, *args, **kwargs)

            routed._routed = True  # the old name's `super()` call reaches the implementation past it
            setattr(cls, new, routed)

    def multiagent_config(self) -> dict:
        """Deprecated: what the run saves as ``multiagent_config.json``. Removed in ``REMOVED_IN``."""
        warn_deprecated(
            f"{TRAINER}.multiagent_config()",
            "the run's saved `multiagent_config.json` (`trl_multiagent.checkpoints.read_multiagent_config(run_dir)`)",
        )
        return self._checkpoints.run_config(self.model)

    @property
    def adapters(self):
        """Deprecated: 0.1.0's ``AdapterUpdates``, split into the trainer's ``ADAPTER_PARTS``. Removed in
        ``REMOVED_IN``."""
        warn_deprecated(f"{TRAINER}.adapters", f"the trainer's private {', '.join(f'`{p}`' for p in ADAPTER_PARTS)}")
        return _AdapterParts(self)


# Every old name -> what replaces it (the two above, and the two with no private twin).
REPLACED_BY = {
    **RENAMED_METHODS,
    **RENAMED_ATTRIBUTES,
    "multiagent_config": "trl_multiagent.checkpoints.read_multiagent_config",
    "adapters": ", ".join(ADAPTER_PARTS),
}

for _old, _new in RENAMED_METHODS.items():
    setattr(RenamedTrainerNames, _old, _method(_old, _new))
for _old, _new in RENAMED_ATTRIBUTES.items():
    setattr(RenamedTrainerNames, _old, _attribute(_old, _new))
