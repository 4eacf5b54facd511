"""``MultiAgentGRPOTrainer``: GRPO over whole-workflow episodes, every role trained from one outcome reward.

One training step, in order (mirrored by the numbered comments below):
    1. run `num_generations` episodes of the workflow per prompt through the rollout engine;
    2. score each episode's final answer with `reward_funcs` (and each role's call with its per-role reward, if
       asked) and turn the rewards into GRPO advantages: over the episodes of each prompt, or per prompt and role;
    3. give every model call its advantage, one training sample per call (`TrainingBatch`);
    4. cut the samples into the update schedule's optimizer steps (merged: TRL's `steps_per_generation` chunks;
       mini-batches: each adapter's sequential mini-batches) and memory-bounded micro-batches, none dropped, with
       exact per-sample weights (role weights, role balance, uneven micro-batches);
    5. TRL's loss on each micro-batch, every sample routed to its role's adapter (`SampleRouting`), plus the
       per-role KL term and entropy bonus (training/role_loss_terms.py).

Each step calls into the package's other folders with what it needs (training/, rollout/, adapters/, monitoring/); what
the trainer is made of is built in parts.py by the `_build_*` steps of `__init__`, the log-probs read before an update
are logps_before_update.py's, a step's forwards over routed samples and the updates they make (steps 4 and 5) are
step_forwards.py's, the optimizer steps over the adapters are adapters/clip_and_step.py's, and what a checkpoint holds
is checkpoints/run.py's. The TRL hooks for those delegate here in a few lines.
"""

from __future__ import annotations

import copy
import functools

import torch
from accelerate.utils import gather, gather_object

from ..adapters.clip_and_step import step_norm
from ..checkpoints.atomic import resume_checkpoint
from ..checkpoints.resume_command import resume_advice
from ..common.model_names import resolve_model_name
from ..config import MultiAgentGRPOConfig
from ..config.model_flags import check_quantization
from ..config.run_checks import check_run
from ..rollout.backends.from_config import BackendContext, backend_metrics, build_backend
from ..seams.liger import layer_kernels
from ..tasks.bad_rows import SkippedRowsCallback
from ..training.batch import TrainingBatch
from ..training.entropy_control import EntropyStepCallback
from ..training.episode_rewards import episode_rewards
from ..training.episode_samples import episode_samples
from ..training.loss_weights import LossScale
from ..training.role_loss_terms import RoleLossTerms
from ..training.role_rewards import RequestedRoleRewards
from ..workflows.base import Workflow
from .grpo_seam import GRPOSeam
from .logps_before_update import LogpsBeforeUpdate, without_gradients
from .parts import AdapterParts, MonitoringParts, RolloutParts, kernels_under_adapters, prepare_role_base
from .renamed_hooks import RenamedTrainerNames
from .step_forwards import StepForwards


class MultiAgentGRPOTrainer(GRPOSeam, RenamedTrainerNames):
    """GRPO for multi-agent workflows. Takes every argument of [`~trl.GRPOTrainer`] plus `workflow`.

    Its public methods are TRL's; it reaches TRL's private hooks and state only through [`GRPOSeam`] (grpo_seam.py),
    by private names of its own there. Its public names of 0.1.0 that became private still work until 0.3.0, with a
    warning (renamed_hooks.py).

    Args:
        workflow ([`Workflow`]): the roles and how they talk; each `generate` call is one training sample.
        peft_config (`peft.LoraConfig`): the configuration of every role adapter (required: roles are adapters).
        rollout_backend: an object with `generate(requests) -> results` to use instead of the one named by
            `args.rollout_backend` (tests pass scripted backends here).
        answer_checker: `(text, answer) -> bool`, with the dataset's `answer` column, regrades every answering role's
            own outputs (`workflow/regraded/<role>`, pass@N over voters or workers, verdict accuracy).
        tools: Python functions (sync or async; type hints and a Google-style docstring) every role may call, as
            GRPOTrainer's `tools`: each `generate` runs a tool loop (rollout/tool_loop.py), every model call of it a
            training sample whose prompt holds the earlier turns and tool outputs; up to `max_tool_calling_iterations`
            rounds; the chat template must support tools.
        role_tools: `{role: [function, ...]}`: tools for some roles only (added to the workflow's declared `tools`).
        environment_factory: GRPOTrainer's: a callable making an environment (or `{name: callable}`, routed by the
            rows' `environment` column), for a workflow with one role: one instance per episode, reset with its row,
            its public methods that role's tools; reward functions get `environments`, and an environment with
            `get_reward` is a reward function of its own (rollout/environments.py).
    """

    _generates_itself = True  # its rollout backend generates; TRL's vLLM client never starts (`use_vllm` kept)

    def __init__(
        self,
        model,
        workflow: Workflow,
        reward_funcs=None,
        args: MultiAgentGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        rollout_backend=None,
        answer_checker=None,
        role_reward_funcs=None,
        quantization_config=None,
        tools=None,
        role_tools=None,
        environment_factory=None,
        **unsupported,
    ):
        if isinstance(model, str):  # a registered name ("toy", or one a user registered) stands for its folder
            model = resolve_model_name(model)
        # Every check of the settings that needs no weights, before any is loaded (`--validate` makes the same ones).
        checked = check_run(
            args,
            workflow,
            model=model,
            peft_config=peft_config,
            train_dataset=train_dataset,
            reward_funcs=reward_funcs,
            role_reward_funcs=role_reward_funcs,
            environment_factory=environment_factory,
            unsupported=unsupported,
        )
        args = checked.args
        check_quantization(quantization_config or (args.model_init_kwargs or {}).get("quantization_config"))
        self.workflow, self.role_adapters = workflow, checked.role_adapters
        lora = copy.deepcopy(peft_config)  # for other base models: PEFT resolves "all-linear" into the one it is given
        kernels = layer_kernels(args.use_liger_kernel, args.liger_kernel_config)  # `use_liger_kernel`, or None
        with kernels_under_adapters(kernels, model):
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=checked.train_dataset,  # malformed rows left out under `bad_rows="skip"`
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                reward_processing_classes=reward_processing_classes,
                callbacks=callbacks,
                optimizers=optimizers,
                quantization_config=quantization_config,
                peft_config=peft_config,
                environment_factory=environment_factory,
            )
        if checked.skipped_rows:
            self.add_callback(SkippedRowsCallback(len(checked.skipped_rows)))
        if self._is_vision_language_model:
            raise ValueError("Vision-language models are not supported: role prompts are text, no image reaches them.")
        # What the trainer is made of, once TRL's trainer exists, in this order (each part uses those before it).
        self._build_loss_terms(args)
        self._build_adapters(args, lora, quantization_config, kernels)
        self._build_rollouts(args, rollout_backend, tools, role_tools, environment_factory, checked.rollout_ahead)
        self._answer_checker, self.role_reward_funcs = answer_checker, role_reward_funcs
        self._build_monitoring(args)
        self._build_step_forwards(args)

    def _build_adapters(self, args: MultiAgentGRPOConfig, lora, quantization_config, kernels) -> None:
        """The base models the roles sit on, every role adapter on its base and the parts of its update (parts.py)."""
        adapters = AdapterParts.build(
            args,
            model=self.model,
            workflow=self.workflow,
            role_adapters=self.role_adapters,
            accelerator=self.accelerator,
            peft_config=lora,
            quantization_config=quantization_config,
            decay_parameter_names=self.get_decay_parameter_names,
            deepspeed=self.is_deepspeed_enabled,
            prepare_role_base=functools.partial(prepare_role_base, kernels=kernels, temperature=args.temperature),
            entropy_control=self._role_terms.entropy,  # saved beside the adapters under adaptive control
        )
        self.bases, self.role_adapters = adapters.bases, adapters.bases.role_adapters  # placed on the bases
        self._updates, self._adapter_steps, self._adapter_check = adapters.updates, adapters.steps, adapters.check
        self._checkpoints = adapters.checkpoints  # what a run saves beside TRL's checkpoint (checkpoints/run.py)
        self._earlier_update_norms: list[float] = []  # this step's mini-batch updates so far: norms before clipping

    def _build_loss_terms(self, args: MultiAgentGRPOConfig) -> None:
        """The loss's terms per role (training/role_loss_terms.py): KL, loss weight and entropy bonus."""
        # The KL term is computed here, per role, against the base model reached by routing samples to no adapter;
        # TRL's own reference pass (disable_adapter) would leave non-active adapters frozen.
        self.role_beta = {role: float((args.role_beta or {}).get(role, args.beta)) for role in self.workflow.roles}
        self.beta = 0.0
        self.role_loss_weights = dict(args.role_loss_weights or {})
        # TRL's entropy bonus and adaptive control, per role (training/entropy_control.py), in place of TRL's own.
        self._role_terms = RoleLossTerms(
            args,
            self.workflow.roles,
            high_entropy_mask=self.get_high_entropy_mask,
            record_kl=lambda *kl: self._monitoring.step_metrics.role_kl(*kl),
        )
        self._leave_entropy_bonus_to_us()
        if self._role_terms.entropy.active:
            self.add_callback(
                EntropyStepCallback(self._role_terms.entropy, self.accelerator, record=self._record_metrics)
            )

    def _build_rollouts(self, args, rollout_backend, tools, role_tools, environment_factory, ahead: bool) -> None:
        """The rollout backend, what runs episodes over it (parts.py), and the log-probs read before the update."""
        self.rollout_backend = rollout_backend or build_backend(args, self._backend_context())
        self._rollout = RolloutParts.build(
            args,
            workflow=self.workflow,
            backend=self.rollout_backend,
            bases=self.bases,
            installed=self._updates.installed,
            tokenizer=self._text_tokenizer,
            reward_funcs=self.reward_funcs,
            tools=tools,
            role_tools=role_tools,
            environments=environment_factory,
            environment_instances=self._environment_instances,
            accelerator=self.accelerator,
            unwrapped_model=self._unwrapped_for_generation,
            trainer_state=lambda: self.state,
            ahead=ahead,
        )
        self.engine = self._rollout.engine
        weights = self.reward_weights.tolist()
        self._role_rewards = RequestedRoleRewards(
            self.workflow, variant=args.role_rewards, reward_funcs=self.reward_funcs, reward_weights=weights
        )
        self._before_update = LogpsBeforeUpdate(
            args,
            roles=self.workflow.roles,
            routed_logps=lambda batch, adapters, mode: self._step_forwards.routed_logps(batch, adapters, mode),
            no_grad_forwards=lambda: without_gradients(self.model, self.args.gradient_checkpointing_kwargs),
            adapter_check=self._adapter_check,
            record=self._record_metrics,
            sum_over_processes=lambda t: self.accelerator.reduce(t, reduction="sum"),
            global_step=lambda: self.state.global_step,
            ran_ahead=lambda: self._rollout.rollouts.ran_ahead,
            backend_name=type(self.rollout_backend).__name__,
        )

    def _build_monitoring(self, args: MultiAgentGRPOConfig) -> None:
        """What each step records and checks, and the callbacks: drift alarms, the summary, the update size."""
        self._monitoring = MonitoringParts.build(
            args,
            workflow=self.workflow,
            callback_handler=self.callback_handler,
            accelerator=self.accelerator,
            record=self._record_metrics,
            record_column=self._record_completion_column,
            record_completions=self._record_completions,
            reward_names=self.reward_func_names,
            answer_checker=self._answer_checker,
            log_update_size=self._before_update.log_update_size,
        )

    def _build_step_forwards(self, args: MultiAgentGRPOConfig) -> None:
        """A step's forwards over routed samples and the updates they make (step_forwards.py), over the parts above."""
        self._step_forwards = StepForwards(
            args,
            model=lambda: self.model,
            accelerator=self.accelerator,
            updates=self._updates,
            adapter_steps=self._adapter_steps,
            before_update=self._before_update,
            step_metrics=self._monitoring.step_metrics,
            loss_type=self.loss_type,
            num_generations=self.num_generations,
            pad_token_id=self._text_tokenizer.pad_token_id,
            router_loss=getattr(self, "aux_loss_enabled", False),  # TRL's MoE router loss, set in its __init__
            deepspeed=self.is_deepspeed_enabled,
            logps_and_entropies=lambda *inputs, **kwargs: self._logps_and_entropies(*inputs, **kwargs),
            trl_training_step=super().training_step,
            accumulating=self._accumulating,
            clip=self._clip_gradients,
            record=self._record_metrics,
        )

    def _backend_context(self) -> BackendContext:
        """What a rollout backend is built from, read from this trainer now (one context per base model)."""
        context = BackendContext(
            model=self.model,
            adapter_names=self._updates.installed.adapter_names,
            tokenizer=self._text_tokenizer,
            router=self._updates.installed.router,
            unwrapped_model=self._unwrapped_for_generation,
            generation_config=self.generation_config,
            eos_token_ids=self.eos_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
            chat_rendering=self.args.chat_rendering,
            process_index=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes,
            weights_step=lambda: self.state.global_step,
            next_steps=functools.partial(resume_advice, self.args.output_dir),
        )
        return context.on_bases(self.bases, self._updates.installed.routers)

    # ---------------------------------------------------------------------------------------------- 1-3 rollouts
    def _generate_and_score(self, inputs: list[dict]) -> TrainingBatch:
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        if self._rollout.environment_runs is not None:  # one environment per episode, reset with its row
            inputs, self.environments = self._rollout.start_environments(inputs)
        prompts = [row["prompt"] for row in inputs]

        # 1. Episodes: every model call of every episode, batched per tick or sent as made (rollout_mode).
        rollouts = self._rollout.rollouts
        episodes = rollouts.episodes(inputs, training=mode == "train")  # rollout_ahead: ran during the last step
        self._record_metrics(mode, {"timing/rollout_wait_s": rollouts.waited_s})
        self._record_metrics(mode, backend_metrics(self.rollout_backend))  # servers lost and calls failed over

        # 2. Outcome rewards on the final answers (those that take work started as each episode ended), advantages
        # grouped over the episodes of each prompt (training/episode_rewards.py); per-role rewards, if asked.
        rewards = episode_rewards(
            episodes,
            inputs,
            score=lambda rows, completions, ids: self._score_completions(rows, prompts, completions, ids),
            reward_weights=self.reward_weights,
            num_generations=num_generations,
            scale_rewards=self.scale_rewards,
            aggregation=self.multi_objective_aggregation,
            process_index=self.accelerator.process_index,
            count_dropped=self.engine.max_prompt_length is not None,
            gather=gather,
        )
        if rewards.dropped is not None:  # an episode ended by a prompt too long counts in no group
            self._record_metrics(mode, {"workflow/dropped_episodes": rewards.dropped})
        outcome = rewards.local(rewards.rewards)
        role_rewards = self._role_rewards(episodes, inputs, outcome, funcs=self.role_reward_funcs)
        if role_rewards is not None:
            self._monitoring.step_metrics.role_rewards(mode, episodes, role_rewards)

        # 3. One training sample per model call, carrying its episode's (or its role trajectory's) advantage.
        batch = episode_samples(
            episodes,
            rewards,
            args=self.args,
            role_rewards=role_rewards,
            group_key=self.workflow.group_key,
            num_generations=num_generations,
            role_loss_weights=self.role_loss_weights,
            max_prompt_length=self.engine.max_prompt_length,
            pad_token_ids=lambda calls: self.bases.pad_token_ids(calls, self._text_tokenizer),
            device=self.accelerator.device,
            gather=gather,
            gather_object=gather_object,
        )
        tool_roles = self._rollout.tool_roles(self.workflow.roles)
        self.state.num_input_tokens_seen += self._monitoring.rollout(
            mode, episodes, inputs, batch, rewards, group_size=num_generations, tool_roles=tool_roles
        )
        self._before_update.add(batch, episodes, mode, role_beta=self.role_beta)  # old, reference, checks
        return batch

    def get_batch_samples(self, epoch_iterator, num_batches, device):  # rollout_ahead reads the next batch early
        take = super().get_batch_samples
        return self._rollout.rollouts.around(epoch_iterator, lambda batches: take(batches, num_batches, device))

    # --------------------------------------------------------------------------------------- 4 micro-batches
    def _micro_step_inputs(self, generation_batch) -> TrainingBatch:
        # 4. Cut the generation batch into the micro-steps of one optimizer step. TRL's version splits with a fixed
        # chunk size and drops the remainder; workflows make a variable number of calls, so split into near-equal
        # micro-batches and weigh each sample exactly (loss_weights.py), each optimizer step's rows sorted by length
        # so that its forwards pad little (mini_batches.py).
        if isinstance(generation_batch, TrainingBatch):  # a micro-batch `training_step` prepared already
            return generation_batch
        if not self.model.training:  # an evaluation batch: its loss forwards (`compute_loss` adds them up)
            return self._step_forwards.evaluation_forwards(self._generate_and_score(generation_batch))
        steps = self.args.steps_per_generation
        if self._micro_step % (steps * self.num_iterations) == 0 or self._buffered_micro_batches is None:
            batch = self._generate_and_score(generation_batch)
            self._buffered_micro_batches = self._step_forwards.micro_steps_of(batch)
        return self._buffered_micro_batches[self._micro_step % steps]

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-step of TRL's loop: its samples in memory-bounded forwards; under
        `update_schedule="mini_batches"`, the last micro-step of a generation runs every mini-batch step."""
        # As the Trainer's step does, before the rollout reads the mode: after an evaluation (which may have switched
        # the inner model only, under a wrapper). Its step sets it again before each part's forward, so a model
        # already training skips this walk over every module (~1 ms a step on a tiny model).
        if not (model.training and self.model.training):
            model.train()
        step, forwards = self._micro_step, self._step_forwards  # the micro-step's forwards (step_forwards.py)
        if self.args.update_schedule == "mini_batches":
            # On the last micro-step of the generation (outside the Trainer's no_sync), every mini-batch's update.
            self._micro_step = step + 1
            if self._micro_step % self.args.steps_per_generation:
                return torch.zeros((), device=self.accelerator.device)
            batch, accumulation = self._generate_and_score(inputs), self.current_gradient_accumulation_steps
            loss, norms = forwards.mini_batch_update(
                model, batch, num_items_in_batch, optimizer=self.optimizer, accumulation_steps=accumulation
            )
            self._earlier_update_norms.extend(norms)
        else:
            parts = forwards.micro_batches(self._micro_step_inputs(inputs))
            loss = forwards.accumulate(model, parts, num_items_in_batch)
        self._micro_step = step + 1  # TRL's training_step counted each forward
        return loss

    # ------------------------------------------------------------------------------------------------------ 5 loss
    def compute_loss(self, model, inputs: TrainingBatch, return_outputs=False, num_items_in_batch=None):
        if isinstance(inputs, list):  # an evaluation batch in its forwards (`StepForwards.evaluation_forwards`)
            return sum(self.compute_loss(model, part) for part in inputs)
        # 5. Route every sample to its adapter; the routing stays set through backward, so checkpointed layers
        # recompute with the same adapters. TRL's loss, then the per-role KL term on the log-probs it computed.
        training = self.model.training
        model = self._step_forwards.route(inputs, model, training=training)  # the base these samples sit on
        trl_inputs = inputs.to_trl_inputs()
        loss, per_token_logps, entropies = self._trl_loss(model, trl_inputs, return_outputs, num_items_in_batch)
        terms = self._role_terms  # the per-role KL term and entropy bonus (training/role_loss_terms.py)
        loss = terms.added(loss, inputs, per_token_logps, entropies, role_beta=self.role_beta, scale=self._loss_scale)
        self._monitoring.step_metrics.loss_forward(
            "train" if training else "eval",
            inputs,
            logps=per_token_logps.detach(),
            entropies=entropies.detach(),
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
        )
        return loss

    def _logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # Every forward of the loss and of the log-probs before the update runs without an attention mask: one sample
        # a row, or packed, a row per adapter (step_forwards.py); TRL's log-prob computation runs on those rows
        # unchanged.
        padding_mask = bool(kwargs.get("compute_aux_loss"))
        rows = self._step_forwards.laid_out(input_ids, attention_mask, logits_to_keep, padding_mask=padding_mask)
        logps, entropies, aux_loss = super()._logps_and_entropies(
            rows.model(model), rows.input_ids, rows.scored, rows.logits_to_keep, *args, **kwargs
        )
        return rows.completion_values(logps), rows.completion_values(entropies), aux_loss

    def _loss_scale(self) -> LossScale:
        return LossScale(
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
            max_completion_length=self.max_completion_length,
            num_processes=self.accelerator.num_processes,
            steps_per_generation=self.args.steps_per_generation,
            training=self.model.training,
        )

    # ---------------------------------------------------------------------------------------- the optimizer step
    # The mechanics of each optimizer step over the adapters: adapters/clip_and_step.py (`AdapterSteps`).
    def create_optimizer(self, model=None):
        return self._updates.optimizer.create(
            functools.partial(super().create_optimizer, model),
            weight_decay=self.args.weight_decay,
            decay_parameter_names=self.get_decay_parameter_names,
            deepspeed_plugin=self.accelerator.state.deepspeed_plugin,
        )

    def create_scheduler(self, num_training_steps: int, optimizer=None):  # lr_scheduler_steps: per_update_lr.py
        self.lr_scheduler = self._updates.optimizer.scheduled(super().create_scheduler(num_training_steps, optimizer))
        return self.lr_scheduler

    def _clip_gradients(self, model):
        return self._adapter_steps.clip(model, functools.partial(super()._clip_gradients, model))

    def _step_grad_norm(self, model, grad_norm=None):
        """The training step's `grad_norm`, before clipping, over every optimizer update of the step (the earlier
        mini-batch updates' added in squares). The Trainer calls it once a step, before the last update; the step's
        gradient metrics are recorded here."""
        if grad_norm is None:  # no clipping this run: the same preparation happens here instead
            grad_norm = self._adapter_steps.unclipped_norm(model)
        grad_norm = step_norm(super()._step_grad_norm(model, grad_norm=grad_norm), self._earlier_update_norms)
        self._earlier_update_norms = []
        self._monitoring.step_metrics.updates(self._updates.accounts.step_measured(), self.role_adapters)
        return grad_norm

    # ------------------------------------------------------------------------------------------ checkpoints
    # What a run saves beside TRL's checkpoint and reads back on resume: checkpoints/run.py (`RunCheckpoints`).
    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        if resume_from_checkpoint is True:  # the newest complete checkpoint, naming any it skipped
            resume_from_checkpoint = resume_checkpoint(self.args.output_dir)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    def _write_checkpoint(self, model, trial) -> None:
        super()._write_checkpoint(model, trial)
        if self.args.should_save:
            self._checkpoints.save_update_state(self._checkpoint_folder(trial))

    def _restore_optimizer_and_scheduler(self, checkpoint) -> None:
        super()._restore_optimizer_and_scheduler(checkpoint)
        self._checkpoints.restore(checkpoint, self.model, deepspeed=self.is_deepspeed_enabled)

    def _save_model_files(self, output_dir: str | None = None, state_dict=None) -> None:
        super()._save_model_files(output_dir, self.bases.own_state(state_dict))  # the trainer's base's adapters only
        self._checkpoints.save_run_files(
            output_dir or self.args.output_dir,
            self.model,
            should_save=self.args.should_save,
            log_history=self.state.log_history,
            hub_model_id=self.hub_model_id,
        )

    def _load_model_weights(self, resume_from_checkpoint: str, model=None) -> None:
        # Replaces the Trainer's loading: every role adapter, on every base, from its own folder.
        self._checkpoints.load_adapters(self.accelerator.unwrap_model(model or self.model), resume_from_checkpoint)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        # Replaces TRL's card (library_name transformers): the run's card and one per role adapter folder.
        if self.is_world_process_zero():
            self._checkpoints.write_cards(
                self.args.output_dir,
                self.model,
                log_history=self.state.log_history,
                hub_model_id=self.hub_model_id,
                dataset_name=dataset_name,
                tags=tags,
            )
