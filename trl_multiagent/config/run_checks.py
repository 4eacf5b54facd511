"""The checks a run's settings must pass, made before anything is loaded: ``MultiAgentGRPOTrainer`` makes them first
when it is built, and ``--validate`` (validation.py) makes them alone, on any machine, to say whether a command would
start. One function for both, so that validation cannot drift from what the trainer refuses.

They read the settings, the workflow, the first rows of the dataset and how the run is launched (``Launch``: under a
DeepSpeed engine or not, how many processes), never the model's weights or a device. What needs those (a
vision-language model, TRL's own checks of the loaded model, the rollout backend) is checked as the trainer builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..adapters.bases import place_roles
from ..adapters.routing import resolve_role_adapters
from ..checkpoints.workflow_config import check_workflow_config
from ..common.model_names import model_name
from ..rollout.environments import EMPTY_PROMPT, check_environment_run
from ..rollout.probe import check_prompt_column, probe_first_row
from ..rollout.records import Episode
from ..seams.trl import check_lm_head_cast
from ..tasks.bad_rows import BadRow, check_training_rows
from ..training.mini_batches import check_schedule
from ..workflows.base import Workflow
from .multiagent_grpo_config import MultiAgentGRPOConfig, check_rollout_ahead, check_trainer_arguments


@dataclass(frozen=True)
class Launch:
    """How a run is launched, as its trainer will see it."""

    deepspeed: bool  # a DeepSpeed engine will hold the model
    num_processes: int  # training processes over every machine
    deepspeed_config: Mapping[str, Any] | None = None  # the engine's config, as DeepSpeed's plugin holds it

    @classmethod
    def of(cls, args: MultiAgentGRPOConfig) -> Launch:
        """Read from the parsed settings, which the Trainer builds its accelerator from: TrainingArguments make a
        ``deepspeed_plugin`` when given ``deepspeed`` or when accelerate launched DeepSpeed (its environment says so),
        and ``world_size`` is the number of processes."""
        plugin = args.deepspeed_plugin
        config = None if plugin is None else plugin.deepspeed_config
        return cls(deepspeed=plugin is not None, num_processes=args.world_size, deepspeed_config=config)


@dataclass(frozen=True)
class CheckedRun:
    """What the checks worked out on the way, for the trainer to build on."""

    args: MultiAgentGRPOConfig  # the settings (a default config when none were given)
    launch: Launch
    role_adapters: dict[str, str]  # role -> adapter, as resolved on one base
    rollout_ahead: bool  # whether the next batch's rollout runs during this step
    probe: Episode | None  # the workflow walked on the first row with empty outputs (None without rows)
    train_dataset: Any = None  # the rows to train on: malformed ones left out under `bad_rows="skip"`
    skipped_rows: tuple[BadRow, ...] = ()  # the rows left out


def check_run(
    args: MultiAgentGRPOConfig | None,
    workflow: Workflow,
    *,
    model: Any,
    peft_config: Any,
    train_dataset: Any = None,
    reward_funcs: Any = None,
    role_reward_funcs: Mapping[str, Any] | None = None,
    environment_factory: Any = None,
    unsupported: Mapping[str, Any] | None = None,
) -> CheckedRun:
    """Every check of the trainer's settings that needs neither the model's weights nor a device, in the order the
    trainer makes them; the first that fails raises, naming the fix. ``model``: a name or folder (or a loaded model);
    the other arguments are the trainer's. Every training row is checked (``tasks/bad_rows.py``)."""
    args = check_trainer_arguments(args, workflow, model, peft_config, role_reward_funcs, unsupported)
    if args.cast_lm_head_to_fp32:
        check_lm_head_cast(cast_lm_head_to_fp32=True, tied_embeddings=ties_embeddings(model, args.model_init_kwargs))
    check_workflow_config(workflow)  # a checkpoint must be able to save and rebuild it: fail now, not at a save
    skipped = []
    if environment_factory is None:  # with environments a row may leave its prompt to `reset`, as in TRL
        check_prompt_column(train_dataset, "train_dataset")
        rewards = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        train_dataset, skipped = check_training_rows(train_dataset, rewards, args.bad_rows)
    else:
        check_environment_run(workflow.roles, rollout_ahead=args.rollout_ahead)
    role_adapters = resolve_role_adapters(workflow.roles, args.policy_sharing, args.role_to_adapter)
    if args.role_models and isinstance(model, str):  # a loaded model: its bases are placed as the trainer loads them
        place_roles(args, role_adapters, model_name(model))
    rows = train_dataset if environment_factory is None else [{"prompt": EMPTY_PROMPT}]
    probe = probe_first_row(workflow, role_adapters, rows)  # an undeclared role fails now
    launch = Launch.of(args)
    check_schedule(args, deepspeed=launch.deepspeed, deepspeed_config=launch.deepspeed_config)
    ahead = check_rollout_ahead(args, launch.num_processes)
    return CheckedRun(args, launch, role_adapters, ahead, probe, train_dataset, tuple(skipped))


def ties_embeddings(model: Any, model_init_kwargs: Mapping[str, Any] | None) -> bool:
    """Whether ``model`` (loaded, or a name or folder) has its LM head tied to its input embeddings, as it will be
    loaded. A name whose config cannot be read here (``--validate`` without the Hub, say) counts as untied: validation
    cannot tell, and the trainer, which must read it to load the model, can."""
    kwargs = dict(model_init_kwargs or {})
    if "tie_word_embeddings" in kwargs:
        return bool(kwargs["tie_word_embeddings"])
    if not isinstance(model, str):
        return bool(getattr(model.config, "tie_word_embeddings", False))
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            model, revision=kwargs.get("revision"), trust_remote_code=bool(kwargs.get("trust_remote_code", False))
        )
    except OSError:
        return False
    return bool(getattr(config, "tie_word_embeddings", False))
