"""What ``MultiAgentGRPOTrainer`` is assembled from, once TRL's trainer and the role adapters exist.

Assembly only: each function builds the parts of one room from the run's config and the handles it is given (a
tokenizer, a model handle, callables that read the trainer's state when called), never the trainer itself; the
trainer keeps what they return and calls each part by name in its numbered steps.

1. rollouts (``RolloutParts``): the roles' tools, the environments, the rollout engine over the backend, the rewards
   that start as episodes end, and the rollouts run ahead, which send the trained adapters to the backend first;
2. monitoring (``MonitoringParts``): the metrics a step records, the learning-signal check, and the callbacks (drift
   alarms, the summary) in the trainer's callback handler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather

from ..adapters.bases import Bases
from ..adapters.installed import InstalledAdapters
from ..config import MultiAgentGRPOConfig
from ..monitoring import monitoring_callbacks
from ..monitoring.console import compact_console
from ..monitoring.learning_signal import LearningSignalCheck
from ..monitoring.training_metrics import TrainingMetrics
from ..rollout.ahead import RolloutsAhead
from ..rollout.backends.adapter_sync import AdapterSync
from ..rollout.engine import RolloutEngine
from ..rollout.environments import Environments
from ..rollout.tool_loop import RoleTools, build_role_tools
from ..training.early_rewards import EarlyRewards
from ..workflows.base import Workflow


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
    learning_signal: LearningSignalCheck  # most groups flat while a role fails its format: said once, early

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
    ) -> MonitoringParts:
        """The parts, and the run's callbacks added to ``callback_handler`` (the Trainer's): the alarms first in
        line, so the report_to integrations that log after them see the alarm metrics, and the console compacted.
        ``record(mode, values)`` and ``record_column(column, values)`` write TRL's metric store and completions
        table."""
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
        first, last = monitoring_callbacks(args, formats, trackers=callback_handler.callbacks)
        main = accelerator.is_main_process
        learning_signal = LearningSignalCheck(formats, workflow.config_dict(), main_process=main)
        callback_handler.callbacks[:0] = first
        for callback in last:
            callback_handler.add_callback(callback)
        compact_console(callback_handler.callbacks)  # one line per step; every metric still goes to report_to
        return cls(step_metrics=step_metrics, learning_signal=learning_signal)
