"""What ``MultiAgentGRPOTrainer`` is assembled from, once TRL's trainer exists.

Assembly only: each builder makes the parts of one folder from the run's config and the handles it is given (a
tokenizer, a model handle, callables that read the trainer's state when called), never the trainer itself; the
trainer keeps what they return and calls each part by name in its numbered steps.

1. adapters (``AdapterParts``): the base models the roles sit on, every role adapter on its base and the parts of
   their update, the optimizer steps over them, the check that each role is served by its own adapter, and what a
   checkpoint saves of them;
2. rollouts (``RolloutParts``): the roles' tools, the environments, the rollout engine over the backend, the rewards
   that start as episodes end, and the rollouts run ahead, which send the trained adapters to the backend first;
3. monitoring (``MonitoringParts``): the metrics a step records, the learning-signal check, and the callbacks (drift
   alarms, the summary, the update size) in the trainer's callback handler.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather

from ..adapters.bases import Bases
from ..adapters.clip_and_step import AdapterSteps
from ..adapters.installed import InstalledAdapters
from ..adapters.updates import AdapterUpdates
from ..checkpoints.resume_command import resume_advice
from ..checkpoints.run import RunCheckpoints
from ..config import MultiAgentGRPOConfig
from ..monitoring import monitoring_callbacks
from ..monitoring.adapter_check import AdapterCheck
from ..monitoring.console import compact_console
from ..monitoring.learning_signal import LearningSignalCheck
from ..monitoring.training_metrics import TrainingMetrics
from ..monitoring.update_size import UpdateSizeCallback
from ..rollout.ahead import RolloutsAhead
from ..rollout.backends.adapter_sync import AdapterSync
from ..rollout.engine import RolloutEngine
from ..rollout.environments import Environments
from ..rollout.tool_loop import RoleTools, build_role_tools
from ..training.early_rewards import EarlyRewards
from ..workflows.base import Workflow


@dataclass(frozen=True)
class AdapterParts:
    """The role adapters on their bases, and what updates them."""

    bases: Bases  # which base model serves each role and adapter; the extra bases `role_models` asks for, loaded
    updates: AdapterUpdates  # installed adapters, sample routing, optimizer, process alignment, gradient accounts
    steps: AdapterSteps  # the optimizer steps of a training step over the adapters, and the norm it logs
    check: AdapterCheck  # each role served by its own adapter at the synced version
    checkpoints: RunCheckpoints  # what a checkpoint saves of them beside TRL's files, and reads back on resume

    @classmethod
    def build(
        cls,
        args: MultiAgentGRPOConfig,
        *,
        model: torch.nn.Module,
        workflow: Workflow,
        role_adapters: dict[str, str],
        accelerator: Accelerator,
        peft_config,
        quantization_config,
        decay_parameter_names: Callable,
        deepspeed: bool,
        prepare_role_base: Callable[[torch.nn.Module], None],
    ) -> AdapterParts:
        """The parts over ``model``, the PEFT model TRL built (``peft_config``: a copy of the configuration it was
        given, for the other bases: PEFT resolves "all-linear" into the model it is given); under ``deepspeed`` the
        engine steps and clips, and holds every base (``Bases.hold_in``)."""
        bases = Bases.from_config(
            args,
            peft_model=model,
            role_adapters=role_adapters,
            device=accelerator.device,
            peft_config=peft_config,
            quantization_config=quantization_config,
            score_like_trainer=prepare_role_base,
        )
        updates = AdapterUpdates.from_config(
            model,
            args,
            bases=bases,
            measure_gradients=not deepspeed,
            accelerator=accelerator,
            decay_parameter_names=decay_parameter_names,
        )
        steps = AdapterSteps(updates, args, engine_steps=deepspeed, clip_grad_norm=accelerator.clip_grad_norm_)
        if deepspeed:
            bases.hold_in(model)
        check = AdapterCheck.for_run(args, workflow.roles, bases.role_adapters, model)
        checkpoints = RunCheckpoints(
            workflow,
            bases.role_adapters,
            policy_sharing=args.policy_sharing,
            bases=bases,
            installed=updates.installed,
            update_state=updates.accounts,
        )
        return cls(bases=bases, updates=updates, steps=steps, check=check, checkpoints=checkpoints)


def role_tools_for(
    workflow: Workflow,
    args: MultiAgentGRPOConfig,
    *,
    bases: Bases,
    tokenizer,
    tools: Sequence[Callable[..., Any]] | None,
    role_tools: dict[str, Sequence[Callable[..., Any]]] | None,
) -> dict[str, RoleTools]:
    """Each role's tools (rollout/tool_loop.py), its tool calls read with the tokenizer of the base it sits on
    (``tokenizer``: the trainer's base's)."""
    extra = bases.extra
    role_base = bases.role_base or {}

    def tokenizer_for_role(role: str):
        base = role_base.get(role)
        return extra[base].tokenizer if base in extra else tokenizer

    return build_role_tools(workflow, args, tokenizer_for_role, tools=tools, role_tools=role_tools)


@dataclass(frozen=True)
class RolloutParts:
    """Everything step 1 (the episodes) runs on."""

    role_tools: dict[str, RoleTools]  # the roles with tools -> their tools
    environment_runs: Environments | None  # one environment per episode (`environment_factory`), or None
    engine: RolloutEngine  # episodes of the workflow, every call routed to its role's (base, adapter)
    early_rewards: EarlyRewards  # reward funcs that `scores_each_episode`, started as episodes end
    rollouts: RolloutsAhead  # each generation batch's episodes, run ahead during the step before if asked

    @classmethod
    def build(
        cls,
        args: MultiAgentGRPOConfig,
        *,
        workflow: Workflow,
        backend,
        bases: Bases,
        installed: InstalledAdapters,
        tokenizer,
        reward_funcs: list,
        tools: Sequence[Callable[..., Any]] | None,
        role_tools: dict[str, Sequence[Callable[..., Any]]] | None,
        environments,
        environment_instances: dict | None,
        accelerator: Accelerator,
        unwrapped_model: Callable[[], AbstractContextManager[torch.nn.Module]],
        trainer_state: Callable[[], Any],
        run_episodes: Callable[[list[dict]], list],
        more_steps: Callable[[], bool],
        ahead: bool,
    ) -> RolloutParts:
        """The parts over ``backend`` (built already: it may be the caller's own). ``environments``: the
        ``environment_factory`` (a callable, or ``{name: callable}``), ``environment_instances`` the instances TRL
        made of it; ``trainer_state()``: the Trainer's `state` now; ``run_episodes(rows)`` and ``more_steps()``: what
        the rollouts run ahead call (the trainer's, over ``engine`` and ``early_rewards``); ``ahead``: whether the
        next batch's episodes run during this step, as `check_run` found."""

        def tools_for(tools):
            return role_tools_for(workflow, args, bases=bases, tokenizer=tokenizer, tools=tools, role_tools=role_tools)

        routed_tools = tools_for(tools)
        environment_runs = None
        if environments is not None:
            (role,) = workflow.roles
            environment_runs = Environments(
                environments if isinstance(environments, dict) else {None: environments},
                environment_instances,
                role=role,
                build_tools=lambda methods: tools_for([*(tools or ()), *methods])[role],
            )
        engine = RolloutEngine(
            workflow,
            backend,
            bases.role_adapters,
            args.role_generation_kwargs,
            mode=args.rollout_mode,
            base_for_role=bases.role_base,
            role_tools=routed_tools,
            max_prompt_length=args.prompt_limit_for(type(workflow)),
        )
        # Reward funcs that `scores_each_episode` start as episodes end (wrapped in place in `reward_funcs`).
        early_rewards = EarlyRewards(reward_funcs, trainer_state)
        sync = AdapterSync(
            backend,
            unwrapped_model=unwrapped_model,
            adapters_by_base=installed.by_base,
            weights_step=lambda: trainer_state().global_step,
            is_main_process=accelerator.is_main_process,
            wait_for_everyone=accelerator.wait_for_everyone,
        )
        rollouts = RolloutsAhead(run_episodes, sync, more_steps, ahead=ahead)
        return cls(
            role_tools=routed_tools,
            environment_runs=environment_runs,
            engine=engine,
            early_rewards=early_rewards,
            rollouts=rollouts,
        )


@dataclass(frozen=True)
class MonitoringParts:
    """What a training step records and checks besides TRL's own metrics."""

    step_metrics: TrainingMetrics  # per-role and per-workflow metrics, summed over processes, into TRL's store
    learning_signal: LearningSignalCheck  # a warning when most groups are flat while a role fails its format

    @classmethod
    def build(
        cls,
        args: MultiAgentGRPOConfig,
        *,
        workflow: Workflow,
        callback_handler,
        accelerator: Accelerator,
        record: Callable[[str, dict[str, float]], None],
        record_column: Callable[[str, list], None],
        reward_names: list[str],
        answer_checker: Callable[[str, Any], bool] | None,
        log_update_size: Callable[[], None],
    ) -> MonitoringParts:
        """The parts, and the run's callbacks added to ``callback_handler`` (the Trainer's): the alarms first in
        line, so the report_to integrations that log after them see the alarm metrics, and the console compacted.
        ``record(mode, values)`` and ``record_column(column, values)`` write TRL's metric store and completions
        table; ``log_update_size()`` records the step's update size after its updates (``monitor_update_size``)."""
        step_metrics = TrainingMetrics(
            workflow,
            record=record,
            record_column=record_column,
            gather=gather,
            reduce_sum=lambda t: accelerator.reduce(t, reduction="sum"),
            device=accelerator.device,
            reward_names=reward_names,
            answer_checker=answer_checker,
        )
        formats = workflow.formats
        resume = functools.partial(resume_advice, args.output_dir)  # printed when a drift alarm stops the run
        first, last = monitoring_callbacks(args, formats, trackers=callback_handler.callbacks, resume=resume)
        main = accelerator.is_main_process
        learning_signal = LearningSignalCheck(formats, workflow.config_dict(), main_process=main)
        callback_handler.callbacks[:0] = first
        for callback in last:
            callback_handler.add_callback(callback)
        if args.monitor_update_size:
            callback_handler.add_callback(UpdateSizeCallback(log_update_size))
        compact_console(callback_handler.callbacks)  # one line per step; every metric still goes to report_to
        return cls(step_metrics=step_metrics, learning_signal=learning_signal)
