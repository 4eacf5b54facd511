"""What ``MultiAgentGRPOTrainer`` is assembled from, once TRL's trainer exists.

Each builder makes the parts of one folder from the run's config and the handles it is given (a tokenizer, a model
handle, callables that read the trainer's state when called), never the trainer itself; the trainer keeps what they
return and calls each part by name in its numbered steps. Before TRL's trainer exists, ``kernels_under_adapters``
puts Liger's layer kernels into the model it is given.

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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather
from peft import PeftModel

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
from ..seams.peft import skip_input_casts_autocast_undoes
from ..seams.trl import before_peft_wraps, score_like_trl
from ..training.early_rewards import EarlyRewards
from ..training.entropy_control import RoleEntropyControl
from ..training.episode_rewards import EpisodeRewards
from ..workflows.base import Workflow


def kernels_under_adapters(kernels: Callable[[torch.nn.Module], None] | None, model) -> AbstractContextManager:
    """Liger's layer kernels (``kernels``: `use_liger_kernel`'s, or None) go into a base model before adapters wrap
    its layers: into a ready PeftModel's base now, into a model TRL loads while the returned context lasts."""
    if kernels is None:
        return nullcontext()
    if isinstance(model, PeftModel):
        kernels(model.get_base_model())  # under the adapters it came with
    return before_peft_wraps(kernels)


def prepare_role_base(model: torch.nn.Module, *, kernels, temperature: float) -> None:
    """A base model of `role_models`, loaded, before PEFT wraps it: Liger's layer kernels (``kernels``, None without
    `use_liger_kernel`) as on the trainer's model, and TRL's scoring of completions."""
    if kernels is not None:
        kernels(model)
    score_like_trl(model, temperature)


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
        entropy_control: RoleEntropyControl,
    ) -> AdapterParts:
        """The parts over ``model``, the PEFT model TRL built (``peft_config``: a copy of the configuration it was
        given, for the other bases: PEFT resolves "all-linear" into the model it is given); under ``deepspeed`` the
        engine steps and clips, and holds every base (``Bases.hold_in``). A checkpoint saves ``entropy_control``'s
        state beside the adapters' under adaptive control."""
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
        for base in updates.installed.models.values():  # fp32 LoRA on a bf16 base: no cast autocast undoes
            skip_input_casts_autocast_undoes(base)
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
            entropy_control=entropy_control if entropy_control.adaptive else None,
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


@dataclass
class RolloutParts:
    """Everything step 1 (the episodes) runs on, and how it runs them."""

    role_tools: dict[str, RoleTools]  # the roles with tools -> their tools
    environment_runs: Environments | None  # one environment per episode (`environment_factory`), or None
    engine: RolloutEngine  # episodes of the workflow, every call routed to its role's (base, adapter)
    early_rewards: EarlyRewards  # reward funcs that `scores_each_episode`, started as episodes end
    rollouts: RolloutsAhead = field(init=False)  # each generation batch's episodes, run ahead during the step before
    episode_tools: list[dict[str, RoleTools]] | None = None  # each episode's tools from its environment, this batch

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
        ahead: bool,
    ) -> RolloutParts:
        """The parts over ``backend`` (built already: it may be the caller's own). ``environments``: the
        ``environment_factory`` (a callable, or ``{name: callable}``), ``environment_instances`` the instances TRL
        made of it; ``trainer_state()``: the Trainer's `state` now; ``ahead``: whether the next batch's episodes run
        during this step, as `check_run` found."""

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
        parts = cls(
            role_tools=routed_tools, environment_runs=environment_runs, engine=engine, early_rewards=early_rewards
        )

        def more_steps() -> bool:  # whether another training step follows this one
            return trainer_state().global_step + 1 < trainer_state().max_steps

        parts.rollouts = RolloutsAhead(parts.run_episodes, sync, more_steps, ahead=ahead)
        return parts

    def start_environments(self, rows: list[dict]) -> tuple[list[dict], list]:
        """One environment per episode, reset with its row: the rows with their first observations and the
        environments (TRL's reward functions get them); each episode's tools are its environment's methods."""
        started = self.environment_runs.start(rows)
        self.episode_tools = started.episode_tools
        return started.rows, started.environments

    def run_episodes(self, rows: list[dict]) -> list:
        """The episodes of ``rows`` over the engine, each with its environment's tools, rewards that take work
        started as each ends."""
        run = self.engine.run
        if self.episode_tools is not None:
            run = functools.partial(run, episode_tools=self.episode_tools)
        return self.early_rewards.run(rows, run)

    def tool_roles(self, roles: Sequence[str]) -> list[str] | None:
        """The roles whose tool calls are logged; None when no role has tools in this run."""
        if not self.role_tools and self.environment_runs is None:
            return None
        return [r for r in roles if r in self.role_tools or self.episode_tools]


@dataclass(frozen=True)
class MonitoringParts:
    """What a training step records and checks besides TRL's own metrics."""

    step_metrics: TrainingMetrics  # per-role and per-workflow metrics, summed over processes, into TRL's store
    learning_signal: LearningSignalCheck  # a warning when most groups are flat while a role fails its format
    record: Callable[[str, dict[str, float]], None]  # TRL's metric store
    record_completions: Callable[..., None]  # TRL's completions table: (mode, prompts, answers, rewards, advantages)

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
        record_completions: Callable[..., None],
        reward_names: list[str],
        answer_checker: Callable[[str, Any], bool] | None,
        log_update_size: Callable[[], None],
    ) -> MonitoringParts:
        """The parts, and the run's callbacks added to ``callback_handler`` (the Trainer's): the alarms first in
        line, so the report_to integrations that log after them see the alarm metrics, and the console compacted.
        ``record(mode, values)``, ``record_column(column, values)`` and ``record_completions`` write TRL's metric
        store and completions table; ``log_update_size()`` records the step's update size after its updates
        (``monitor_update_size``)."""
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
        return cls(step_metrics, learning_signal, record=record, record_completions=record_completions)

    def rollout(
        self,
        mode: str,
        episodes,
        rows: list[dict],
        batch,
        rewards: EpisodeRewards,
        *,
        group_size: int,
        tool_roles: list[str] | None,
    ) -> int:
        """A generation batch's metrics and completions table, as TRL logs its own, and in training the
        learning-signal warning (``group_size``: the episodes of a prompt; ``tool_roles``: the roles whose tool calls
        are logged); returns the input tokens it holds, which the Trainer counts."""
        tokens = self.step_metrics.rollout_batch(
            mode, episodes, batch, rewards=rewards.logged, rewards_per_func=rewards.per_func, tool_roles=tool_roles
        )
        prompts, answers = [row["prompt"] for row in rows], [e.final_answer for e in episodes]
        self.record_completions(mode, prompts, answers, rewards.per_func, rewards.advantages)
        values = self.step_metrics.workflow_batch(mode, episodes, rows, rewards=rewards.local(rewards.logged))
        if mode == "train":  # a warning when most groups are flat while a role fails its format
            groups = rewards.logged.view(-1, group_size).tolist()
            self.record(mode, self.learning_signal.observe(groups, values))
        return tokens
