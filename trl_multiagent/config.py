"""``MultiAgentGRPOConfig``: TRL's ``GRPOConfig`` plus the knobs of multi-agent workflow training."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from .rollout.chat_rendering import CHAT_RENDERINGS, check_chat_rendering

logger = logging.getLogger(__name__)

ROLE_LOSS_BALANCES = ("per_output", "per_role")
UPDATE_SCHEDULES = ("merged", "mini_batches")
LR_SCHEDULER_STEPS = ("per_training_step", "per_update")
ADVANTAGE_GROUPS = ("episodes", "roles", "calls")
ROLE_REWARDS = (None, "reference", "own_answers")
ROLLOUT_BACKENDS = ("transformers", "vllm")
ROLLOUT_MODES = ("ticks", "async")


@dataclass
class MultiAgentGRPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`MultiAgentGRPOTrainer`].

    Every [`~trl.GRPOConfig`] parameter keeps its meaning; `num_generations` is the number of *workflow episodes*
    per prompt, and each model call of an episode becomes one training sample.

    Parameters:
        > Parameters that control policy sharing

        policy_sharing (`str`, *optional*, defaults to `"shared"`):
            `"shared"`: one LoRA adapter trained by every role. `"isolated"`: one adapter per role *type* (the three
            voters of Voting share the `generator` adapter). Ignored when `role_to_adapter` is set.
        role_to_adapter (`dict[str, str]` or `str`, *optional*):
            Explicit role-to-adapter grouping, e.g. `{"generator": "solver", "evaluator": "judge"}`. Must map every
            role of the workflow. A JSON string is accepted on the command line.
        role_models (`dict[str, str]` or `str`, *optional*):
            Base model per role type, e.g. `{"evaluator": "Qwen/Qwen3-0.6B"}`: any `from_pretrained` name or folder,
            or a shipped toy name (`"toy"`). Roles not listed sit on the trainer's `model`. Each distinct base is
            loaded once (with `model_init_kwargs`), with its own tokenizer and chat template, and gets the trainer's
            `peft_config`; `policy_sharing` and `role_to_adapter` apply within a base (under shared policy, one
            adapter per base: `shared` on `model`, `shared-<name>` on another base). One optimizer steps every
            adapter of every base; DDP works, DeepSpeed does not (refused). A JSON string is accepted on the command
            line.

        > Parameters that control the loss

        role_loss_weights (`dict[str, float]` or `str`, *optional*):
            Multiplier of each role type's loss (policy term and KL term). Roles not listed weigh `1.0`; `0.0` freezes
            a role, also under shared policy.
        role_loss_balance (`str`, *optional*, defaults to `"per_output"`):
            `"per_output"`: every model call weighs the same (the reference behaviour: three voters outweigh one
            aggregator). `"per_role"`: every role type gets the same total share of the loss, whatever its number of
            calls and, for token-level loss types, tokens.
        update_schedule (`str`, *optional*, defaults to `"merged"`):
            How the samples of one training step update the adapters. `"merged"`: TRL's step, every adapter takes one
            optimizer step on all its samples (the paper's fix for parallel roles). `"mini_batches"`: the research
            stack's PPO update: each adapter's samples are cut, in episode order, into mini-batches of
            `mini_batch_prompts * num_generations` samples, and each mini-batch is one optimizer step at the current
            weights (log-probs recorded once, before the first), one adapter after the other, each clipped on its
            own; a short last mini-batch is scaled by its size over the full size. A parallel role then takes
            several steps per training step from its data volume (three voters: three steps). Needs
            `num_iterations=1` and no DeepSpeed; the learning-rate scheduler steps as `lr_scheduler_steps` says.
        mini_batch_prompts (`int`, *optional*):
            Prompts per mini-batch under `update_schedule="mini_batches"` (the reference: 64). Defaults to the
            prompts of one generation batch, so that a role with one call per episode takes one step per training
            step, as in the reference, where the two are equal.
        lr_scheduler_steps (`str`, *optional*, defaults to `"per_training_step"`):
            When the learning-rate scheduler steps. `"per_training_step"`: the Trainer's own, once per optimizer step
            of the Trainer (the schedule spans `max_steps` training steps). `"per_update"`: once per adapter update
            call, as upstream verl's actor steps its scheduler at the end of every update call, which the reference
            makes once per role adapter: with k adapters the schedule advances k times per training step (1 under
            shared policy) over the same `max_steps` horizon, and the cosine is not clamped past its end, so a
            500-step cosine reaches 0 at step 250 with k = 2 and rises back to the peak by step 500. Under
            `update_schedule="mini_batches"` each adapter's run of mini-batches is one call (the next adapter trains
            at the next rate); under `"merged"` the one optimizer step counts as k calls. Not with DeepSpeed.
        prompts_per_step (`int`, *optional*):
            Prompts per training step over all processes (the reference's `train_batch_size`, 64 whatever the number
            of GPUs). When set, `per_device_train_batch_size` is derived from it: `prompts_per_step *
            num_generations / (num_processes * gradient_accumulation_steps)` episodes per process and micro-step, so
            that a step trains the same episodes, and `update_schedule="mini_batches"` takes the same optimizer
            steps, on any number of processes (an error names the process counts that divide it); leave
            `generation_batch_size` and `steps_per_generation` unset. `None`: TRL's sizes, which grow with the number
            of processes.
        max_tokens_per_micro_batch (`int`, *optional*):
            Memory bound of one forward/backward: micro-batches hold at most `per_device_train_batch_size` samples and
            at most this many (padded) tokens, with exact gradient accumulation, whatever the number of calls per
            episode (the reference packs at most 51,200 tokens per GPU). `None`: no token bound.
        mix_adapters_in_forward (`bool`, *optional*, defaults to `False`):
            `False`: each forward of the loss and log-probs holds one adapter's samples (PEFT's plain LoRA path, each
            adapter's samples padded on their own, as the reference trains each agent on its own batches); `True`: one
            forward routes each sample to its adapter (PEFT's mixed-batch path, fewer forwards, more gather/scatter).
            Gradients are the same either way.
        advantage_groups (`str`, *optional*, defaults to `"episodes"`):
            GRPO groups. `"episodes"` (library default): the episodes of one prompt form a group and every call
            carries its episode's advantage (TRL's statistics: std with eps 1e-4). `"calls"` (the reference's, its
            uid `{prompt}_{trajectory name}_step0`; the paper preset): every call is one sample with its own reward,
            grouped per prompt and `Workflow.trajectory_name` (the role; Voting's math voters apart): all of a role's
            calls over a prompt's episodes, Eval-Opt's repeated attempts and Orch-Workers' workers included, form one
            group; mean and unbiased std with eps 1e-6, a group of one keeps its raw score (verl's). `"roles"`: one
            group per prompt, role and instance, a role instance's calls in an episode pooled into one value first
            (their mean), a group of one gets 0; it weighs episodes, not calls, where roles repeat.
        role_rewards (`str`, *optional*):
            Built-in per-role rewards, read from the workflow's declared role formats and graded by `reward_funcs`
            (`trl_multiagent/training/role_rewards.py`). `"reference"`: the reference stack's per-role variant: an
            answer (generator, voter, synthesizer) rewarded when it is right, a verdict when it matches whether the
            attempt it judged is right (an unreadable verdict 0), a selection when the answer it chose is right, and
            the roles in `Workflow.zero_role_reward` 0 (Orch-Workers' orchestrator and workers, as in the reference).
            `"own_answers"`: the same but nothing zeroed: workers by their own answers, a plan by the episode's
            outcome, an unreadable verdict read as Incorrect. Per call under `advantage_groups="calls"`, pooled per
            role trajectory otherwise; logged as `role/<role>/role_reward`. Custom ones: the trainer's
            `role_reward_funcs`.
        role_reward_weight (`float`, *optional*, defaults to `1.0`):
            A call with a per-role reward gets `(1 - w) * outcome advantage + w * role advantage`, both in the groups
            of `advantage_groups`. 1: the reference's per-role variant (the role reward replaces the outcome; the
            reference mixes nothing); 0: outcome only.
        clip_grad_norm_per_adapter (`bool`, *optional*, defaults to `False`):
            Clip each adapter's gradient to `max_grad_norm` on its own (the reference under isolated policy) instead
            of the norm over all adapters. Always the case under `update_schedule="mini_batches"`, where every step
            updates one adapter.
        role_beta (`dict[str, float]` or `str`, *optional*):
            KL coefficient toward the base model (adapters bypassed) per role type. Roles not listed use `beta`.

        role_coherence_lambda (`dict[str, float]` or `str`, *optional*):
            Gradient coherence damping per role: its adapter's gradient is scaled by
            `1 - lambda * clamp(cos(g, EMA), 0, 1)` before clipping, at every optimizer step (lambda <= 0.3
            recommended). As in the reference: the EMA starts as the first gradient (the first step is damped by
            `1 - lambda`) and follows the damped gradients. Roles sharing an adapter must share lambda.
        role_coherence_window (`int`, *optional*, defaults to `10`):
            Window of the coherence EMA: it decays by `1 - 1/window` per optimizer step.
        monitor_role_grad_norms (`bool`, *optional*, defaults to `False`):
            Log `role/<role>/grad_norm` and its share also for roles that share an adapter (under shared policy):
            each such role trains a shadow copy of the adapter whose gradient is summed back before the step, so the
            update is unchanged, at the cost of mixed-adapter forward passes.
        monitor_kl_to_base (`bool`, *optional*, defaults to `False`):
            Log `role/<role>/kl` (KL to the base model) even for roles with no KL penalty; costs one extra no-grad
            forward pass of each generation batch.

        > Parameters that control monitoring

        drift_alarms (`bool`, *optional*, defaults to `True`):
            Watch every role for the drift signatures of the research (a judge writing code or solver-length
            outputs, length drift, outputs at the length cap, a perplexity or entropy rise before accuracy falls) and
            log a warning and an `alarm/<role>/<kind>` metric when one appears.
        drift_thresholds (`dict[str, float]` or `str`, *optional*):
            Overrides of `trl_multiagent.monitoring.DriftThresholds` fields, e.g. `{"length_drift_factor": 2.0}`.
        stop_on_drift (`bool`, *optional*, defaults to `False`):
            Stop training at the first drift alarm.
        training_summary (`bool`, *optional*, defaults to `True`):
            When training ends, print how success, the workflow metrics and every per-role metric moved (first vs
            last logged values) and save `training_summary.png` (each metric over steps) in `output_dir`.

        > Parameters that control rollouts

        rollout_backend (`str`, *optional*, defaults to `"transformers"`):
            Engine that generates role outputs. `"transformers"` batches every pending call of a tick into one
            `generate` with per-sample adapters. `"vllm"` (needs `vllm`) serves every role adapter as a vLLM LoRA,
            synced after each optimizer step: in this process with `vllm_mode="colocate"`, or through a `vllm serve
            --enable-lora` server at `vllm_server_base_url` with `vllm_mode="server"`. TRL's `vllm_*` fields apply,
            `vllm_importance_sampling_correction` included.
        rollout_mode (`str`, *optional*, defaults to `"ticks"`):
            How episodes reach the backend. `"ticks"`: every pending call of every episode goes out as one batch and
            no episode moves on until the whole batch has returned (the only mode of the transformers backend).
            `"async"` (needs `rollout_backend="vllm"`): each call goes to vLLM the moment its episode makes it and the
            episode resumes when its own result arrives, while vLLM batches continuously (the reference stack's
            `rollout.mode: async`); colocated, vLLM's `AsyncLLM` runs in this process's child process.
        rollout_ahead (`int`, *optional*, defaults to `0`):
            `1`: generate the next generation batch while training on the current one (bounded off-policy: the batch a
            step trains on was sampled with the adapters of one optimizer step earlier; `vllm_importance_sampling_
            correction` reweighs it). Needs `rollout_backend="vllm"`, `update_schedule="merged"` and one process.
        vllm_server_base_urls (`list[str]` or `str`, *optional*):
            Several `vllm serve` servers (data-parallel copies, e.g. one per node) to balance rollouts over, instead of
            `vllm_server_base_url`; a comma-separated string is accepted on the command line. Every server receives
            every adapter update; an episode's calls stay on the server that took its first call (its prefix cache).
        vllm_server_max_concurrency (`int`, *optional*, defaults to `256`):
            Most requests in flight per server; further calls wait for a slot.
        vllm_request_timeout (`float`, *optional*, defaults to `600.0`):
            Seconds one generation request may take before the rollout fails naming the server; a refused connection
            or a 502/503/504 is retried with backoff (0.5 to 4 s, 5 tries), a timeout is not.
        rollout_batch_size (`int`, *optional*):
            Largest batch sent to one `generate` call; `None` sends all pending calls of a tick at once.
        rollout_max_batch_tokens (`int`, *optional*):
            Memory bound of one `generate` call of the transformers backend: its prompts x (longest prompt + max new
            tokens), the KV cache it can reach, stays within this many tokens (prompts are grouped shortest first;
            a call longer than the budget on its own runs alone, with a warning). `None`: no token bound. The vLLM
            backend manages its own cache (`vllm_gpu_memory_utilization`).
        role_generation_kwargs (`dict[str, dict]` or `str`, *optional*):
            Sampling settings per role type, overriding the run's for that role's calls, e.g.
            `{"evaluator": {"temperature": 0.3, "max_tokens": 512, "stop": ["</verdict>"]}}`. Keys: `temperature`
            (`0` is greedy), `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_tokens`, `stop` (a completion
            ending on a stop string keeps it). Honoured by both rollout backends. A JSON string is accepted on the
            command line.
        chat_rendering (`str`, *optional*, defaults to `"tokenizer"`):
            How a call's messages become its prompt, in every rollout backend. `"tokenizer"`: the tokenizer's chat
            template with `chat_template_kwargs`. `"reference_qwen"` (the paper preset): the reference stack's Qwen
            rendering (rLLM's parser with thinking disabled): Qwen's default system prompt ("You are Qwen, created by
            Alibaba Cloud. You are a helpful assistant.") before every call that does not start with a system message,
            and an empty think block opening every assistant turn, the earlier ones as well as the generation prompt
            (Qwen3's own template with `enable_thinking=False` adds neither to earlier turns, nor the system prompt).
            Needs a tokenizer with Qwen's `<|im_start|>`/`<|im_end|>` tokens.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + [
        "role_to_adapter",
        "role_models",
        "role_loss_weights",
        "role_beta",
        "role_coherence_lambda",
        "drift_thresholds",
        "role_generation_kwargs",
    ]

    policy_sharing: str = field(
        default="shared",
        metadata={
            "help": "'shared': one adapter for all roles; 'isolated': one adapter per role type.",
            "choices": ["shared", "isolated"],
        },
    )
    role_to_adapter: dict[str, str] | str | None = field(
        default=None,
        metadata={"help": "Explicit role-to-adapter mapping (JSON on the command line); overrides policy_sharing."},
    )
    role_models: dict[str, str] | str | None = field(
        default=None,
        metadata={"help": "Base model per role type (JSON on the command line); unlisted roles use `model`."},
    )
    role_loss_weights: dict[str, float] | str | None = field(
        default=None,
        metadata={"help": "Loss multiplier per role type (JSON on the command line); unlisted roles weigh 1.0."},
    )
    role_loss_balance: str = field(
        default="per_output",
        metadata={
            "help": "'per_output': each model call weighs the same; 'per_role': each role type gets an equal share.",
            "choices": list(ROLE_LOSS_BALANCES),
        },
    )
    update_schedule: str = field(
        default="merged",
        metadata={
            "help": "'merged': one optimizer step per training step; 'mini_batches': the research stack's sequential "
            "mini-batch steps per adapter.",
            "choices": list(UPDATE_SCHEDULES),
        },
    )
    mini_batch_prompts: int | None = field(
        default=None,
        metadata={
            "help": "Prompts per mini-batch under update_schedule='mini_batches' (default: a generation batch)."
        },
    )
    lr_scheduler_steps: str = field(
        default="per_training_step",
        metadata={
            "help": "'per_training_step': the scheduler steps once per training step; 'per_update': once per "
            "adapter update call (upstream verl's: k times per training step with k adapters).",
            "choices": list(LR_SCHEDULER_STEPS),
        },
    )
    prompts_per_step: int | None = field(
        default=None,
        metadata={"help": "Prompts per training step over all processes; derives per_device_train_batch_size."},
    )
    max_tokens_per_micro_batch: int | None = field(
        default=None, metadata={"help": "Padded tokens per forward/backward micro-batch (None: no bound)."}
    )
    mix_adapters_in_forward: bool = field(
        default=False,
        metadata={"help": "One forward for every adapter's samples (PEFT's mixed batch) instead of one per adapter."},
    )
    advantage_groups: str = field(
        default="episodes",
        metadata={"help": "'episodes': one GRPO group per prompt; 'calls' (the reference's): per prompt and "
                          "trajectory name, each call a sample; 'roles': per prompt, role and instance, calls pooled.",
                  "choices": list(ADVANTAGE_GROUPS)},
    )  # fmt: skip
    role_rewards: str | None = field(
        default=None,
        metadata={"help": "'reference': the reference stack's per-role rewards; 'own_answers': ours, no role zeroed "
                          "(see the docstring).",
                  "choices": list(ROLE_REWARDS)},
    )  # fmt: skip
    role_reward_weight: float = field(
        default=1.0, metadata={"help": "Share of the per-role reward's advantage in a call's (0-1; 1: the reference)."}
    )
    clip_grad_norm_per_adapter: bool = field(
        default=False, metadata={"help": "Clip each adapter's gradient norm on its own (max_grad_norm)."}
    )
    role_beta: dict[str, float] | str | None = field(
        default=None,
        metadata={"help": "KL coefficient toward the base model per role type; unlisted roles use `beta`."},
    )
    role_coherence_lambda: dict[str, float] | str | None = field(
        default=None, metadata={"help": "Gradient coherence damping lambda per role (JSON on the command line)."}
    )
    role_coherence_window: int = field(default=10, metadata={"help": "Steps averaged by the coherence EMA."})
    monitor_role_grad_norms: bool = field(
        default=False,
        metadata={"help": "Measure each role's gradient contribution under a shared adapter (role shadows)."},
    )
    monitor_kl_to_base: bool = field(
        default=False, metadata={"help": "Log per-role KL to the base model even without a KL penalty."}
    )
    drift_alarms: bool = field(default=True, metadata={"help": "Log alarms on per-role drift signatures."})
    drift_thresholds: dict[str, float] | str | None = field(
        default=None, metadata={"help": "Overrides of DriftThresholds fields (JSON on the command line)."}
    )
    stop_on_drift: bool = field(default=False, metadata={"help": "Stop training at the first drift alarm."})
    training_summary: bool = field(
        default=True,
        metadata={"help": "Print a per-role summary table and save training_summary.png in output_dir at the end."},
    )
    rollout_backend: str = field(
        default="transformers",
        metadata={"help": "Rollout engine backend.", "choices": list(ROLLOUT_BACKENDS)},
    )
    rollout_mode: str = field(
        default="ticks",
        metadata={"help": "'ticks': one batch per tick; 'async': each call sent as made (vLLM).",
                  "choices": list(ROLLOUT_MODES)},
    )  # fmt: skip
    rollout_ahead: int = field(
        default=0,
        metadata={"help": "1: generate the next batch while training on the current one (off by one step).",
                  "choices": [0, 1]},
    )  # fmt: skip
    vllm_server_base_urls: list[str] | str | None = field(
        default=None,
        metadata={"help": "Several vLLM server URLs to balance rollouts over (comma-separated on the command line)."},
    )
    vllm_server_max_concurrency: int = field(default=256, metadata={"help": "Most requests in flight per server."})
    vllm_request_timeout: float = field(
        default=600.0, metadata={"help": "Seconds one vLLM server request may take before the rollout fails."}
    )
    rollout_batch_size: int | None = field(
        default=None,
        metadata={"help": "Largest batch of one generate call; None sends all pending calls of a tick at once."},
    )
    rollout_max_batch_tokens: int | None = field(
        default=None,
        metadata={"help": "Tokens (prompts x (longest prompt + max new tokens)) per transformers generate call."},
    )
    role_generation_kwargs: dict[str, dict[str, Any]] | str | None = field(
        default=None,
        metadata={
            "help": "Sampling settings per role type (JSON on the command line), e.g. "
            '\'{"evaluator": {"temperature": 0.3, "max_tokens": 512, "stop": ["</verdict>"]}}\'.'
        },
    )
    chat_rendering: str = field(
        default="tokenizer",
        metadata={
            "help": "'tokenizer': the chat template with chat_template_kwargs; 'reference_qwen': the reference "
            "stack's Qwen rendering (default system prompt, empty think blocks).",
            "choices": list(CHAT_RENDERINGS),
        },
    )

    def __post_init__(self):
        asked_batch_size = self._whole_step_batch()  # before TRL derives its sizes from the per-process batch
        super().__post_init__()
        self._split_step_over_processes(asked_batch_size)
        if self.rollout_max_batch_tokens is not None and self.rollout_max_batch_tokens <= (
            self.max_completion_length or 0
        ):
            raise ValueError(
                f"`rollout_max_batch_tokens` ({self.rollout_max_batch_tokens}) must exceed max_completion_length "
                f"({self.max_completion_length}): a generate call holds at least one prompt plus its new tokens."
            )
        if self.policy_sharing not in ("shared", "isolated"):
            raise ValueError(f"`policy_sharing` must be 'shared' or 'isolated', got {self.policy_sharing!r}.")
        if self.role_loss_balance not in ROLE_LOSS_BALANCES:
            raise ValueError(
                f"`role_loss_balance` must be one of {ROLE_LOSS_BALANCES}, got {self.role_loss_balance!r}."
            )
        if self.update_schedule not in UPDATE_SCHEDULES:
            raise ValueError(f"`update_schedule` must be one of {UPDATE_SCHEDULES}, got {self.update_schedule!r}.")
        if self.lr_scheduler_steps not in LR_SCHEDULER_STEPS:
            raise ValueError(
                f"`lr_scheduler_steps` must be one of {LR_SCHEDULER_STEPS}, got {self.lr_scheduler_steps!r}."
            )
        if self.lr_scheduler_steps == "per_update" and self.lr_scheduler_type == "reduce_lr_on_plateau":
            raise ValueError(
                "lr_scheduler_steps='per_update' counts steps of a schedule; 'reduce_lr_on_plateau' steps on a "
                "metric. Set lr_scheduler_steps='per_training_step' or another lr_scheduler_type."
            )
        if self.advantage_groups not in ADVANTAGE_GROUPS:
            raise ValueError(f"`advantage_groups` must be one of {ADVANTAGE_GROUPS}, got {self.advantage_groups!r}.")
        if self.role_rewards not in ROLE_REWARDS:
            raise ValueError(f"`role_rewards` must be one of {ROLE_REWARDS}, got {self.role_rewards!r}.")
        if not 0.0 <= self.role_reward_weight <= 1.0:
            raise ValueError(f"`role_reward_weight` must be in [0, 1], got {self.role_reward_weight}.")
        if self.update_schedule == "mini_batches" and self.num_iterations != 1:
            raise ValueError(
                "`update_schedule='mini_batches'` takes each mini-batch once (the reference's ppo_epochs=1); set "
                f"num_iterations=1 (got {self.num_iterations}) or use update_schedule='merged'."
            )
        for name in ("mini_batch_prompts", "max_tokens_per_micro_batch"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1 or None, got {getattr(self, name)}.")
        batch_prompts = self.generation_batch_size // self.num_generations
        if self.update_schedule == "mini_batches" and (self.mini_batch_prompts or 0) > batch_prompts:
            logger.warning(
                "mini_batch_prompts=%d is more than the %d prompts of one generation batch (generation_batch_size %d "
                "/ num_generations %d): every adapter takes a single optimizer step per training step, so a parallel "
                "role gets none of the reference schedule's extra steps. Set mini_batch_prompts to at most %d, or to "
                "None (one generation batch, the reference's ratio: 64 prompts in both).",
                self.mini_batch_prompts, batch_prompts, self.generation_batch_size, self.num_generations,
                batch_prompts,
            )  # fmt: skip
        if self.role_coherence_window < 1:
            raise ValueError(f"`role_coherence_window` must be >= 1, got {self.role_coherence_window}.")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"`rollout_backend` must be one of {ROLLOUT_BACKENDS}, got {self.rollout_backend!r}.")
        self._check_rollout_fields()
        check_chat_rendering(self.chat_rendering, self.chat_template_kwargs)
        if self.rollout_backend == "vllm" and self.vllm_mode == "colocate" and self.vllm_tensor_parallel_size != 1:
            raise ValueError(
                "A colocated vLLM rollout engine runs one copy per process (`vllm_tensor_parallel_size=1`); for "
                "tensor parallelism start `vllm serve --tensor-parallel-size N` and set `vllm_mode='server'`."
            )
        for name in ("role_loss_weights", "role_beta", "role_coherence_lambda"):
            _check_role_numbers(name, getattr(self, name))
        if self.role_to_adapter is not None and not isinstance(self.role_to_adapter, dict):
            raise ValueError(f"`role_to_adapter` must be a dict (or JSON object), got {self.role_to_adapter!r}.")
        if self.role_models is not None and (
            not isinstance(self.role_models, dict)
            or not all(isinstance(name, str) and name for name in self.role_models.values())
        ):
            raise ValueError(
                f"`role_models` must be a dict of role -> model name or folder (or a JSON object), got "
                f"{self.role_models!r}."
            )
        if self.use_vllm:
            raise ValueError(
                "`use_vllm` drives TRL's single-completion generation, which multi-agent rollouts do not use. "
                "Choose the rollout engine with `rollout_backend` instead."
            )

    def _whole_step_batch(self) -> int | None:
        """Under ``prompts_per_step``: the per-process batch for one process (divided once the number is known, after
        TRL's checks, which then see whole prompt groups); returns the per-process batch asked for."""
        if self.prompts_per_step is None:
            return None
        if self.prompts_per_step < 1:
            raise ValueError(f"`prompts_per_step` must be >= 1 or None, got {self.prompts_per_step}.")
        episodes, accumulation = self.prompts_per_step * self.num_generations, self.gradient_accumulation_steps
        if (self.generation_batch_size, self.steps_per_generation) not in ((None, None), (episodes, accumulation)):
            raise ValueError(
                "`prompts_per_step` sets generation_batch_size (prompts_per_step x num_generations) and "
                "steps_per_generation (gradient_accumulation_steps); leave both unset, or set prompts_per_step=None."
            )
        self.generation_batch_size = self.steps_per_generation = None  # a copy of a derived config derives again
        if episodes % accumulation:
            raise ValueError(
                f"prompts_per_step={self.prompts_per_step} x num_generations={self.num_generations} = {episodes} "
                f"episodes per step do not split into gradient_accumulation_steps={accumulation} micro-steps; use a "
                f"divisor of {episodes}."
            )
        asked, self.per_device_train_batch_size = self.per_device_train_batch_size, episodes // accumulation
        return asked

    def _split_step_over_processes(self, asked_batch_size: int | None) -> None:
        if self.prompts_per_step is None:
            return
        one_process, processes = self.per_device_train_batch_size, self.world_size
        if one_process % processes:
            works = [n for n in range(1, one_process + 1) if one_process % n == 0]
            raise ValueError(
                f"prompts_per_step={self.prompts_per_step} x num_generations={self.num_generations} episodes per step "
                f"over {processes} processes x gradient_accumulation_steps={self.gradient_accumulation_steps} is "
                f"not a whole number per process and micro-step. Run on one of {works} processes, or change "
                "prompts_per_step or gradient_accumulation_steps."
            )
        derived = one_process // processes
        default = type(self).__dataclass_fields__["per_device_train_batch_size"].default
        if asked_batch_size not in (default, derived):
            raise ValueError(
                f"per_device_train_batch_size={asked_batch_size} conflicts with prompts_per_step="
                f"{self.prompts_per_step}, which makes it {derived} on {processes} process(es). Drop one: set "
                "prompts_per_step=None (`--prompts_per_step None`) to size the per-process batch yourself."
            )
        self.per_device_train_batch_size = derived
        self.steps_per_generation = self.gradient_accumulation_steps
        self.generation_batch_size = self.prompts_per_step * self.num_generations
        if self.deepspeed:  # TrainingArguments filled DeepSpeed's "auto" batch sizes from the undivided batch
            from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

            self.hf_deepspeed_config = HfTrainerDeepSpeedConfig(self.deepspeed)
            self.hf_deepspeed_config.trainer_config_process(self)

    def _check_rollout_fields(self) -> None:
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"`rollout_mode` must be one of {ROLLOUT_MODES}, got {self.rollout_mode!r}.")
        if self.rollout_mode == "async" and self.rollout_backend != "vllm":
            raise ValueError(
                "rollout_mode='async' needs a backend that batches continuously; the transformers backend batches per "
                "tick. Set rollout_backend='vllm' or rollout_mode='ticks'."
            )
        if self.rollout_ahead not in (0, 1):
            raise ValueError(f"`rollout_ahead` must be 0 or 1, got {self.rollout_ahead!r}.")
        if self.rollout_ahead and (self.rollout_backend != "vllm" or self.update_schedule != "merged"):
            raise ValueError(
                "rollout_ahead=1 overlaps the next rollout with training, which needs a rollout engine apart from the "
                "trained model (rollout_backend='vllm') and update_schedule='merged'."
            )
        if isinstance(self.vllm_server_base_urls, str):
            self.vllm_server_base_urls = [url.strip() for url in self.vllm_server_base_urls.split(",") if url.strip()]
        if self.vllm_server_base_urls is not None:
            if not self.vllm_server_base_urls or not all(
                isinstance(url, str) and url.startswith(("http://", "https://")) for url in self.vllm_server_base_urls
            ):
                raise ValueError(
                    "`vllm_server_base_urls` must list http(s) URLs, e.g. ['http://node0:8000', 'http://node1:8000'], "
                    f"got {self.vllm_server_base_urls!r}."
                )
            if self.vllm_server_base_url is not None:
                raise ValueError("Set `vllm_server_base_url` (one server) or `vllm_server_base_urls`, not both.")
            if self.vllm_mode != "server":
                raise ValueError("`vllm_server_base_urls` is for vllm_mode='server'; set it, or drop the URLs.")
        if self.vllm_server_max_concurrency < 1 or self.vllm_request_timeout <= 0:
            raise ValueError(
                "`vllm_server_max_concurrency` must be >= 1 and `vllm_request_timeout` > 0, got "
                f"{self.vllm_server_max_concurrency} and {self.vllm_request_timeout}."
            )

    def check_roles(self, roles) -> None:
        """Fail if a per-role field names a role the workflow does not have."""
        for name in ("role_models", "role_loss_weights", "role_beta", "role_coherence_lambda"):
            unknown = sorted(set(getattr(self, name) or {}) - set(roles))
            if unknown:
                raise ValueError(f"`{name}` names role(s) {unknown}; the workflow's roles are {list(roles)}.")


def _check_role_numbers(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict of role -> number (or a JSON object), got {value!r}.")
    for role, number in value.items():
        if not isinstance(number, int | float) or number < 0:
            raise ValueError(f"`{name}[{role!r}]` must be a number >= 0, got {number!r}.")


UNSUPPORTED_TRL_ARGUMENTS = {
    "tools": "tool calling inside one completion",
    "rollout_func": "a custom single-completion rollout",
    "environment_factory": "environments",
}


def check_rollout_ahead(args: MultiAgentGRPOConfig, trainer) -> bool:
    """Whether ``rollout_ahead`` is on, once the rest of the run fits it (the config checked the fields alone)."""
    if not args.rollout_ahead:
        return False
    num_processes = trainer.accelerator.num_processes
    if num_processes > 1 or args.num_iterations != 1 or args.steps_per_generation != args.gradient_accumulation_steps:
        raise ValueError(
            "rollout_ahead=1 reads the next generation batch one optimizer step early, which needs one training "
            f"process (got {num_processes}), num_iterations=1 (got {args.num_iterations}) and steps_per_generation "
            f"equal to gradient_accumulation_steps (got {args.steps_per_generation} and "
            f"{args.gradient_accumulation_steps}); set rollout_ahead=0 otherwise."
        )
    if not args.vllm_importance_sampling_correction:
        raise ValueError(
            "rollout_ahead=1 trains on episodes sampled one optimizer step earlier; set "
            "vllm_importance_sampling_correction=True so that TRL reweighs them (the paper preset turns it off, as "
            "the reference does: add --vllm_importance_sampling_correction true, or set rollout_ahead=0)."
        )
    return True


def check_trainer_arguments(
    args, workflow, model, peft_config, role_reward_funcs=None, unsupported=None
) -> MultiAgentGRPOConfig:
    """``args`` (a default config when None) once the trainer's own arguments are known to fit together."""
    from peft import PeftModel

    from .workflows.base import Workflow

    for name, value in (unsupported or {}).items():
        what = UNSUPPORTED_TRL_ARGUMENTS.get(name)
        if what is None:
            raise TypeError(f"MultiAgentGRPOTrainer got an unexpected keyword argument {name!r}.")
        if value is not None:
            raise ValueError(
                f"`{name}` ({what}) is a GRPOTrainer feature that multi-agent rollouts do not support: the workflow "
                "makes the model calls. Write the steps as a Workflow (its `run` may call tools between its calls)."
            )
    if args is None:
        args = MultiAgentGRPOConfig(output_dir="trl-multiagent-output")
    if not isinstance(args, MultiAgentGRPOConfig):
        raise TypeError(f"`args` must be a MultiAgentGRPOConfig, got {type(args).__name__}.")
    if not isinstance(workflow, Workflow) or not workflow.roles:
        raise TypeError("`workflow` must be a trl_multiagent Workflow subclass instance with non-empty `roles`.")
    if peft_config is None and not isinstance(model, PeftModel):
        raise ValueError(
            "Pass a LoRA `peft_config` (or a ready PeftModel): every role is trained as a LoRA adapter on a frozen "
            "base."
        )
    if isinstance(model, PeftModel) and args.beta != 0.0:
        raise ValueError(
            "With a ready PeftModel, TRL would anchor the KL term to a copy of its 'default' adapter; the per-role KL "
            "here anchors to the base model. Pass the base model with `peft_config`, or set beta=0."
        )
    if args.use_liger_kernel:
        raise ValueError("`use_liger_kernel` replaces the loss forward that routes each sample to its role's adapter.")
    args.check_roles(workflow.roles)
    if role_reward_funcs is not None and args.role_rewards is not None:
        raise ValueError("Pass `role_reward_funcs` or set `role_rewards`, not both.")
    unknown = sorted(set(role_reward_funcs or {}) - set(workflow.roles))
    if unknown:
        raise ValueError(
            f"`role_reward_funcs` names role(s) {unknown}; the workflow's roles are {list(workflow.roles)}."
        )
    if args.role_rewards is not None and not workflow.formats:
        raise ValueError(
            f"role_rewards={args.role_rewards!r} reads the roles' declared output formats, and "
            f"{type(workflow).__name__} declares none (`formats = {{role: BoxedAnswer(), ...}}`); declare them or "
            "pass `role_reward_funcs`."
        )
    return args
