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
       per-role KL term.

Each step calls into the package's other folders with what it needs (training/, rollout/, adapters/, monitoring/); what
the trainer is made of is built in parts.py, the optimizer steps over the adapters are adapters/clip_and_step.py's, and
what a checkpoint holds is checkpoints/run.py's. The TRL hooks for those delegate here in a few lines.
"""

from __future__ import annotations

import copy
import functools
from contextlib import nullcontext

import torch
from accelerate.utils import gather, gather_object
from peft import PeftModel

from ..adapters.clip_and_step import step_norm
from ..adapters.routing import BASE_MODEL
from ..checkpoints.atomic import resume_checkpoint
from ..checkpoints.resume_command import resume_advice
from ..checkpoints.role_adapters import load_entropy_control, save_entropy_control
from ..common.model_names import resolve_model_name
from ..config import MultiAgentGRPOConfig
from ..config.model_flags import check_quantization
from ..config.run_checks import check_run
from ..monitoring.update_size import update_size_metrics, update_size_sums
from ..rollout.backends.from_config import BackendContext, backend_metrics, build_backend
from ..seams.accelerate import gradients_synced
from ..seams.deepspeed import clear_zero3_gradients
from ..seams.liger import layer_kernels
from ..seams.peft import skip_input_casts_autocast_undoes
from ..seams.transformers import attention_implementation
from ..seams.trl import (
    batch_importance_sampling_ratio,
    before_peft_wraps,
    disable_gradient_checkpointing,
    entropy_bonus_like_trl,
    score_like_trl,
)
from ..tasks.bad_rows import SkippedRowsCallback
from ..training.advantages import outcome_advantages, weighted_rewards
from ..training.batch import TrainingBatch
from ..training.early_rewards import final_completion_ids, final_completions
from ..training.entropy_control import EntropyStepCallback, RoleEntropyControl
from ..training.episode_samples import episode_samples
from ..training.forwards import Forwards, old_logps_after_first, rollout_logps
from ..training.loss_weights import LossScale, loss_ready, per_role_kl_loss
from ..training.mini_batches import micro_steps, mini_batch_plan
from ..training.recompute import fit_of
from ..training.role_rewards import builtin_role_rewards, custom_role_rewards, outcome_scorer
from ..training.row_layout import LaidOut, layout_for, rows_by_adapter
from ..workflows.base import Workflow
from .grpo_seam import GRPOSeam
from .parts import AdapterParts, MonitoringParts, RolloutParts
from .renamed_hooks import RenamedTrainerNames


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
        train_dataset = checked.train_dataset  # malformed rows left out under `bad_rows="skip"` (tasks/bad_rows.py)
        self.workflow = workflow
        self.role_adapters = checked.role_adapters
        lora = copy.deepcopy(peft_config)  # for other base models: PEFT resolves "all-linear" into the one it is given

        # Liger's layer kernels (`use_liger_kernel`) go into every base model before its adapters wrap its layers.
        kernels = layer_kernels(args.use_liger_kernel, args.liger_kernel_config)
        if kernels is not None and isinstance(model, PeftModel):
            kernels(model.get_base_model())  # a ready PeftModel: its base, under the adapters it came with
        with nullcontext() if kernels is None else before_peft_wraps(kernels):
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
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
        # The base models the roles sit on, every role adapter on its base and the parts of its update (parts.py).
        adapters = AdapterParts.build(
            args,
            model=self.model,
            workflow=workflow,
            role_adapters=self.role_adapters,
            accelerator=self.accelerator,
            peft_config=lora,
            quantization_config=quantization_config,
            decay_parameter_names=self.get_decay_parameter_names,
            deepspeed=self.is_deepspeed_enabled,
            prepare_role_base=lambda base: prepare_role_base(base, kernels, args.temperature),
        )
        self.bases, self.role_adapters = adapters.bases, adapters.bases.role_adapters  # placed on the bases
        self._updates, self._adapter_steps, self._adapter_check = adapters.updates, adapters.steps, adapters.check
        self._checkpoints = adapters.checkpoints  # what a run saves beside TRL's checkpoint (checkpoints/run.py)
        self._earlier_update_norms: list[float] = []  # this step's mini-batch updates so far: norms before clipping
        for model in self._updates.installed.models.values():  # fp32 LoRA on a bf16 base: no cast autocast undoes
            skip_input_casts_autocast_undoes(model)
        # The KL term is computed here, per role, against the base model reached by routing samples to no adapter;
        # TRL's own reference pass (disable_adapter) would leave non-active adapters frozen.
        self.role_beta = {role: float((args.role_beta or {}).get(role, args.beta)) for role in self.workflow.roles}
        self.beta = 0.0
        self.role_loss_weights = dict(args.role_loss_weights or {})
        # TRL's entropy bonus and adaptive control, per role (training/entropy_control.py), in place of TRL's own.
        self._entropy_control = RoleEntropyControl.from_config(args, self.workflow.roles)
        self._leave_entropy_bonus_to_us()
        if self._entropy_control.active:
            self.add_callback(EntropyStepCallback(self._end_entropy_step))

        # The rollout backend, and what runs episodes over it (parts.py).
        self.rollout_backend = rollout_backend or build_backend(args, self._backend_context())
        rollouts = RolloutParts.build(
            args,
            workflow=workflow,
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
            run_episodes=self._run_episodes,
            more_steps=self._more_steps,
            ahead=checked.rollout_ahead,
        )
        self._rollout, self.engine, self._episode_tools = rollouts, rollouts.engine, None
        self._answer_checker = answer_checker
        self.role_reward_funcs = role_reward_funcs
        if args.role_rewards is not None:
            self._score = outcome_scorer(self.reward_funcs, self.reward_weights.tolist())  # grades a role's answer

        # What each step records and checks, and the callbacks: drift alarms, the summary, the update size (parts.py).
        monitoring = MonitoringParts.build(
            args,
            workflow=workflow,
            callback_handler=self.callback_handler,
            accelerator=self.accelerator,
            record=self._record_metrics,
            record_column=self._record_completion_column,
            reward_names=self.reward_func_names,
            answer_checker=answer_checker,
            log_update_size=self._log_update_size,
        )
        self._step_metrics, self._learning_signal = monitoring.step_metrics, monitoring.learning_signal
        self._update_size_before = None  # (generation batch, its log-probs before the step's first update)

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

    def _run_episodes(self, rows: list[dict]) -> list:
        run = self.engine.run
        if self._episode_tools is not None:  # the tools of this step's environments
            run = functools.partial(run, episode_tools=self._episode_tools)
        return self._rollout.early_rewards.run(rows, run)

    def _more_steps(self) -> bool:
        return self.state.global_step + 1 < self.state.max_steps

    # ---------------------------------------------------------------------------------------------- 1-3 rollouts
    def _generate_and_score(self, inputs: list[dict]) -> TrainingBatch:
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        if self._rollout.environment_runs is not None:  # one environment per episode, reset with its row
            started = self._rollout.environment_runs.start(inputs)
            inputs, self.environments, self._episode_tools = started.rows, started.environments, started.episode_tools
        prompts = [row["prompt"] for row in inputs]

        # 1. Episodes: every model call of every episode, batched per tick or sent as made (rollout_mode).
        rollouts = self._rollout.rollouts
        episodes = rollouts.episodes(inputs, training=mode == "train")  # rollout_ahead: ran during the last step
        self._record_metrics(mode, {"timing/rollout_wait_s": rollouts.waited_s})
        self._record_metrics(mode, backend_metrics(self.rollout_backend))  # servers lost and calls failed over

        # 2. Outcome rewards on the final answers (those that take work started as each episode ended), advantages
        # grouped over the episodes of each prompt.
        completions = final_completions(episodes, inputs)
        last_ids = [final_completion_ids(e) for e in episodes]
        rewards_per_func = self._score_completions(inputs, prompts, completions, last_ids)  # [E_all, F], gathered
        if self.engine.max_prompt_length is not None:  # an episode ended by a prompt too long counts in no group
            dropped = gather(torch.tensor([float(e.dropped) for e in episodes], device=self.accelerator.device))
            rewards_per_func[dropped.bool()] = torch.nan
            self._record_metrics(mode, {"workflow/dropped_episodes": dropped.sum().item()})
        rewards, all_advantages = outcome_advantages(
            rewards_per_func,
            self.reward_weights,
            num_generations=num_generations,
            scale_rewards=self.scale_rewards,
            aggregation=self.multi_objective_aggregation,
        )
        start = self.accelerator.process_index * len(prompts)
        local_rewards = rewards[start : start + len(prompts)].tolist()

        # 3. One training sample per model call, carrying its episode's (or its role trajectory's) advantage.
        role_rewards = self._role_rewards(episodes, inputs, outcome=local_rewards, mode=mode)
        batch = episode_samples(
            episodes,
            first_episode=start,
            episode_advantages=all_advantages,
            rewards=rewards,
            role_rewards=role_rewards,
            group_key=self.workflow.group_key,
            num_generations=num_generations,
            scale_rewards=self.scale_rewards,
            advantage_groups=self.args.advantage_groups,
            role_reward_weight=self.args.role_reward_weight,
            role_loss_weights=self.role_loss_weights,
            role_loss_balance=self.args.role_loss_balance,
            loss_type=self.loss_type,
            mask_truncated_completions=self.args.mask_truncated_completions,
            max_prompt_length=self.engine.max_prompt_length,
            pad_token_ids=lambda calls: self.bases.pad_token_ids(calls, self._text_tokenizer),
            device=self.accelerator.device,
            gather=gather,
            gather_object=gather_object,
        )
        # Logged as TRL logs `reward`: the weighted sum of the functions' own outputs, under either aggregation.
        logged = weighted_rewards(rewards_per_func, self.reward_weights)
        tool_roles = self._tool_roles()
        self.state.num_input_tokens_seen += self._step_metrics.rollout_batch(
            mode, episodes, batch, rewards=logged, rewards_per_func=rewards_per_func, tool_roles=tool_roles
        )
        self._record_completions(mode, prompts, [e.final_answer for e in episodes], rewards_per_func, all_advantages)
        values = self._step_metrics.workflow_batch(
            mode, episodes, inputs, rewards=logged[start : start + len(prompts)].tolist()
        )
        if mode == "train":  # a warning when most groups are flat while a role fails its format
            groups = logged.view(-1, num_generations).tolist()
            self._record_metrics(mode, self._learning_signal.observe(groups, values))
        self._add_logps_before_update(batch, mode)
        self._check_adapters(episodes, batch, mode)
        return batch

    def _role_rewards(self, episodes, rows: list[dict], *, outcome: list[float], mode: str):
        if self.role_reward_funcs:
            values = custom_role_rewards(self.role_reward_funcs, self.workflow.formats, episodes, rows)
        elif self.args.role_rewards is not None:
            values = builtin_role_rewards(self.args.role_rewards, self.workflow, episodes, rows, outcome, self._score)
        else:
            return None
        self._step_metrics.role_rewards(mode, episodes, values)
        return values

    def _tool_roles(self) -> list[str] | None:
        """The roles whose tool calls are logged; None when no role has tools in this run."""
        if not self._rollout.role_tools and self._rollout.environment_runs is None:
            return None
        return [r for r in self.workflow.roles if r in self._rollout.role_tools or self._episode_tools]

    def _add_logps_before_update(self, batch: TrainingBatch, mode: str) -> None:
        """The log-probabilities the loss needs from before the update, each sample through its own adapter."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        recompute = self.args.old_logprobs == "recompute"  # else the rollout's, no forward (config/old_logprobs.py)
        sampled = None if recompute else rollout_logps(batch, backend=type(self.rollout_backend).__name__)
        correct_sampling = batch.sampling_per_token_logps is not None and self.vllm_importance_sampling_correction
        size = self.args.monitor_update_size and mode == "train"  # kept apart: the loss sees what it would without
        # Under mini-batches each adapter's first mini-batch has a policy ratio of exactly one: the others' log-probs
        # are computed once the mini-batches are cut (`_mini_batch_update`), unless every sample's are read here.
        mini_batches = self.args.update_schedule == "mini_batches" and mode == "train"
        check = batch.sampling_per_token_logps is not None and recompute  # the adapter check compares the two
        every_sample = correct_sampling or size or check
        old = self.args.gradient_accumulation_steps % generate_every != 0 or correct_sampling
        old = old or (mini_batches and every_sample)
        if sampled is not None:  # under mini-batches, each mini-batch's own (`_mini_batch_update`)
            if old and not mini_batches:
                batch.old_per_token_logps = sampled
            old = False
        reference = self.args.monitor_kl_to_base or any(self.role_beta.values())  # alike on every process
        if old or reference or size:  # switching checkpointing off and on walks every module twice: only for a forward
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                if old:
                    batch.old_per_token_logps = self._routed_logps(batch, batch.adapters, mode)
                if size:
                    before = batch.old_per_token_logps if old else self._routed_logps(batch, batch.adapters, mode)
                    self._update_size_before = (batch, before)
                if reference:
                    batch.ref_per_token_logps = self._routed_logps(batch, [BASE_MODEL] * len(batch), mode)
        if correct_sampling:  # off under the paper preset: the reference only logs the rollout log-probs
            batch.importance_sampling_ratio = batch_importance_sampling_ratio(batch, self.args)

    def _log_update_size(self) -> None:
        """After a training step's updates: each role's policy ratio on the generation batch's tokens, now against
        before its first update (`monitor_update_size`, monitoring/update_size.py)."""
        if self._update_size_before is None:
            return
        batch, before = self._update_size_before
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            after = self._routed_logps(batch, batch.adapters, "train")
        roles = self.workflow.roles
        sums = update_size_sums(roles, batch.roles, before=before, after=after, mask=batch.completion_mask)
        self._record_metrics("train", update_size_metrics(roles, self.accelerator.reduce(sums, reduction="sum")))

    def _check_adapters(self, episodes, batch: TrainingBatch, mode: str) -> None:
        """Each role served by its own adapter at the synced version, per the backend's stamps and the gap between
        the sampler's log-probs and the trainer's before the update (monitoring/adapter_check.py)."""
        logps = batch.old_per_token_logps
        if batch.sampling_per_token_logps is None or self.args.old_logprobs == "rollout":  # nothing to compare
            logps = None
        elif logps is None:  # the loss's forward of these weights comes too late for the check
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                logps = self._routed_logps(batch, batch.adapters, mode)
        ahead = self._rollout.rollouts.ran_ahead and mode == "train"
        calls = [c for e in episodes for c in e.calls]
        step = self.state.global_step
        metrics = self._adapter_check.check(
            calls=calls, batch=batch, trainer_logps=logps, step=step, ran_ahead=ahead, gather=gather
        )
        self._record_metrics(mode, metrics)

    def _routed_logps(self, batch: TrainingBatch, adapters: list[str], mode: str) -> torch.Tensor:
        """`[N, C]` log-probs of every sample through ``adapters``, in memory-bounded forwards."""

        def forward(part: TrainingBatch, names: list[str]) -> torch.Tensor:
            model, router = self._updates.routing.forward_target(part.adapters, self.model)
            with router.route(names):
                self._routed_samples = (router, names)
                return self._logps_and_entropies(model, *part.model_inputs())[0]

        keys = self._updates.routing.forward_keys(batch.adapters)
        return self._forwards(mode).routed_logps(batch, adapters, keys=keys, forward=forward)

    def _forwards(self, mode: str, *, backward: bool = False) -> Forwards:
        """How this run's forwards are bounded and laid out (training/forwards.py), as the trainer is now; those with
        a ``backward`` hold at most the tokens whose activations fit `activation_memory_gb`, where set."""
        size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        several = self.accelerator.num_processes > 1
        max_tokens, fit = self.args.max_tokens_per_micro_batch, None
        if backward:
            fit = fit_of(self.model, self.args.activation_memory_gb, low_precision=self.args.bf16 or self.args.fp16)
        if fit is not None:
            max_tokens = fit if max_tokens is None else min(max_tokens, fit)
        return Forwards(
            max_samples=size,
            max_tokens=max_tokens,
            layout=self._forward_layout(),
            loss_type=self.loss_type,
            pad_token_id=self._text_tokenizer.pad_token_id,
            alignment=self._updates.alignment,
            most_over_processes=(lambda t: gather(t[None]).max(dim=0).values) if several else None,
            fit=fit,
        )

    _routed_samples: tuple | None = None  # (router, adapter of each sample) of the forward about to run

    def _forward_layout(self) -> str:
        """Packed where the attention reads packed samples without a dense mask; one sample a row elsewhere, and
        always for a MoE router loss, which needs the padding mask (training/row_layout.py)."""
        if getattr(self, "aux_loss_enabled", False):
            return "rows"
        return layout_for(attention_implementation(self.model.config))

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
            return self._evaluation_forwards(loss_ready(self._generate_and_score(generation_batch), self.loss_type))
        steps = self.args.steps_per_generation
        if self._micro_step % (steps * self.num_iterations) == 0 or self._buffered_micro_batches is None:
            batch = self._generate_and_score(generation_batch).shuffled()
            chunks = micro_steps(
                batch,
                steps=steps,
                accumulation=self.args.gradient_accumulation_steps,
                loss_type=self.loss_type,
                num_processes=self.accelerator.num_processes,
            )
            self._buffered_micro_batches = [loss_ready(chunk, self.loss_type) for chunk in chunks]
            trained = gather(torch.tensor([sum(map(len, chunks))], device=self.accelerator.device)).sum()
            self._record_metrics("train", {"workflow/samples_trained": float(trained)})
        return self._buffered_micro_batches[self._micro_step % steps]

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-step of TRL's loop: its samples in memory-bounded forwards; under
        `update_schedule="mini_batches"`, the last micro-step of a generation runs every mini-batch step."""
        # As the Trainer's step does, before the rollout reads the mode: after an evaluation (which may have switched
        # the inner model only, under a wrapper). Its step sets it again before each part's forward, so a model
        # already training skips this walk over every module (~1 ms a step on a tiny model).
        if not (model.training and self.model.training):
            model.train()
        if self.args.update_schedule == "mini_batches":
            return self._mini_batch_update(model, inputs, num_items_in_batch)
        step = self._micro_step
        parts = self._micro_batches(self._micro_step_inputs(inputs))
        loss = self._accumulate(model, parts, num_items_in_batch)
        self._micro_step = step + 1  # TRL's training_step counted each part
        return loss

    def _micro_batches(self, batch: TrainingBatch) -> list[TrainingBatch]:
        """One micro-step's memory-bounded loss forwards, alike on every process (training/forwards.py)."""
        forwards = self._forwards("train", backward=True)
        return forwards.loss_forwards(batch, self._updates.routing.forward_keys(batch.adapters))

    def _evaluation_forwards(self, batch: TrainingBatch) -> list[TrainingBatch]:
        return self._forwards("eval").evaluation_forwards(batch, self._updates.routing.forward_keys(batch.adapters))

    def _accumulate(self, model, parts: list[TrainingBatch], num_items_in_batch, engine_steps=False) -> torch.Tensor:
        """Forward and backward each part; only the last one synchronises gradients across processes (and, under
        DeepSpeed, is followed by the engine's optimizer step: one per micro-step, as without DeepSpeed, or, with
        ``engine_steps``, one after these parts, as a mini-batch's step)."""
        loss = torch.zeros((), device=self.accelerator.device)
        forwards, bases = self._forwards("train", backward=True), list(self._updates.installed.models.values())
        for i, part in enumerate(parts):
            if i < len(parts) - 1:
                context = self._accumulating(model)
            else:
                context = gradients_synced(self.accelerator) if engine_steps else nullcontext()
            checkpointing = self.args.gradient_checkpointing_kwargs  # off where this forward fits the memory
            with context, forwards.recompute(part, models=bases, gradient_checkpointing_kwargs=checkpointing):
                loss = loss + super().training_step(model, part, num_items_in_batch)
        if engine_steps or (self.is_deepspeed_enabled and self.accelerator.sync_gradients):  # the engine stepped
            clear_zero3_gradients(model)
        return loss

    def _mini_batch_update(self, model, inputs, num_items_in_batch) -> torch.Tensor:
        # Runs on the last micro-step of the generation (outside the Trainer's no_sync): every mini-batch but the
        # last takes its optimizer step here (adapters/clip_and_step.py), the last one takes the Trainer's own step.
        step = self._micro_step
        self._micro_step = step + 1
        if self._micro_step % self.args.steps_per_generation:
            return torch.zeros((), device=self.accelerator.device)
        batch = self._generate_and_score(inputs)
        prompts = self.args.mini_batch_prompts or self.args.generation_batch_size // self.num_generations
        plan = mini_batch_plan(
            batch,
            self._updates.installed.adapter_names,
            mini_batch_size=prompts * self.num_generations,
            num_processes=self.accelerator.num_processes,
            sum_over_processes=lambda t: self.accelerator.reduce(t, reduction="sum"),
            loss_type=self.loss_type,
            accumulation_steps=self.current_gradient_accumulation_steps,
            order=self.args.mini_batch_order,
            gather_object=gather_object,
        )

        if batch.old_per_token_logps is None and self.args.old_logprobs == "rollout":  # the sampler's, no forward
            plan = old_logps_after_first(plan, lambda part: part.sampling_per_token_logps)
        elif batch.old_per_token_logps is None:  # each adapter's first mini-batch needs none (its ratio is one)
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                plan = old_logps_after_first(plan, lambda part: self._routed_logps(part, part.adapters, "train"))

        def train(part: TrainingBatch) -> torch.Tensor:
            parts = self._micro_batches(loss_ready(part, self.loss_type))
            return self._accumulate(model, parts, num_items_in_batch, engine_steps=self.is_deepspeed_enabled)

        clip = functools.partial(self._clip_gradients, model)  # under DeepSpeed: the engine's norm of its step
        losses, norms = self._adapter_steps.mini_batch_updates(plan, train=train, optimizer=self.optimizer, clip=clip)
        self._earlier_update_norms.extend(norms)
        steps = {
            f"adapter/{a}/optimizer_steps": float(sum(b == a for b, _ in plan))
            for a in self._updates.installed.adapter_names
        }
        self._record_metrics("train", steps)
        self._record_metrics("train", {"workflow/samples_trained": batch.num_samples_in_batch.item()})
        self._micro_step = step + 1
        return sum(losses, torch.zeros((), device=self.accelerator.device))

    # ------------------------------------------------------------------------------------------------------ 5 loss
    def compute_loss(self, model, inputs: TrainingBatch, return_outputs=False, num_items_in_batch=None):
        if isinstance(inputs, list):  # an evaluation batch in its forwards (`_evaluation_forwards`)
            return sum(self.compute_loss(model, part) for part in inputs)
        # 5. Route every sample to its adapter; the routing stays set through backward, so checkpointed layers
        # recompute with the same adapters. TRL's loss, then the per-role KL term on the log-probs it computed.
        training = self.model.training
        model, router = self._updates.routing.forward_target(inputs.adapters, model)  # the base these samples sit on
        names = self._updates.routing.names(inputs.adapters, inputs.roles, training)
        self._routed_samples = (router, names)
        router.set(names)
        trl_inputs = inputs.to_trl_inputs()
        loss, per_token_logps, entropies = self._trl_loss(model, trl_inputs, return_outputs, num_items_in_batch)
        if inputs.ref_per_token_logps is not None:
            loss = loss + self._kl_loss(per_token_logps, inputs)
        if self._entropy_control.active:
            loss = loss - self._entropy_bonus(entropies, inputs)
        self._step_metrics.loss_forward(
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
        # a row, or packed, a row per adapter (training/row_layout.py); TRL's log-prob computation runs on those rows
        # unchanged. Packed rows are routed row by row, as long as the forward lasts (its backward included).
        layout, row_of = self._forward_layout(), None
        router, names = self._routed_samples or (None, None)
        self._routed_samples = None  # said for this forward only
        if layout == "packed" and (names is None or len(names) != len(input_ids)):
            layout = "rows"  # a forward whose routing is not known here: its rows as they are routed
        if layout == "packed":
            row_names, row_of = rows_by_adapter(names)
            router.set(row_names)
        rows = LaidOut.of(
            input_ids,
            attention_mask,
            logits_to_keep,
            layout=layout,
            pad_to_multiple_of=self.args.pad_to_multiple_of,
            padding_mask=bool(kwargs.get("compute_aux_loss")),
            pad_token_id=self._text_tokenizer.pad_token_id,
            row_of=row_of,
        )
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

    def _kl_loss(self, per_token_logps: torch.Tensor, inputs: TrainingBatch) -> torch.Tensor:
        beta = torch.tensor([self.role_beta[r] for r in inputs.roles], device=per_token_logps.device)
        loss, per_token_kl = per_role_kl_loss(
            per_token_logps,
            inputs,
            beta,
            loss_type=self.loss_type,
            scale=self._loss_scale(),
            bias_correction=self.args.use_bias_correction_kl,
            importance_sampling_level=self.importance_sampling_level,
        )
        self._step_metrics.role_kl("train" if self.model.training else "eval", inputs, per_token_kl)
        return loss

    def _entropy_bonus(self, entropies: torch.Tensor, inputs: TrainingBatch) -> torch.Tensor:
        # As TRL's loss: on its high-entropy tokens under `top_entropy_quantile`, else on every completion token.
        mask = inputs.completion_mask
        kept = mask
        if self.top_entropy_quantile < 1.0:
            kept = mask * self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        if self.model.training:
            self._entropy_control.observe(inputs.roles, entropies, kept)
        coefficients = self._entropy_control.coefficients(inputs.roles, entropies.device)
        return entropy_bonus_like_trl(
            entropies, mask, kept, coefficients, scale=self._loss_scale(), num_items_in_batch=inputs.num_items_in_batch
        )

    def _end_entropy_step(self) -> None:
        sum_over_processes = lambda t: self.accelerator.reduce(t, reduction="sum")  # noqa: E731
        self._entropy_control.end_step(sum_over_processes, self.accelerator.device)
        self._record_metrics("train", self._entropy_control.metrics())

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
        self._step_metrics.updates(self._updates.accounts.step_measured(), self.role_adapters)
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
            if self._entropy_control.adaptive:
                save_entropy_control(self._checkpoint_folder(trial), self._entropy_control.state_dict())

    def _restore_optimizer_and_scheduler(self, checkpoint) -> None:
        super()._restore_optimizer_and_scheduler(checkpoint)
        self._checkpoints.restore(checkpoint, self.model, deepspeed=self.is_deepspeed_enabled)
        saved = load_entropy_control(checkpoint) if self._entropy_control.adaptive else None
        if saved is not None:
            self._entropy_control.load_state_dict(saved)

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


def prepare_role_base(model: torch.nn.Module, kernels, temperature: float) -> None:
    """A base model of `role_models`, loaded, before PEFT wraps it: Liger's layer kernels (``kernels``, None without
    `use_liger_kernel`) as on the trainer's model, and TRL's scoring of completions."""
    if kernels is not None:
        kernels(model)
    score_like_trl(model, temperature)
