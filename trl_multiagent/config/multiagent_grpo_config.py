"""``MultiAgentGRPOConfig``: TRL's ``GRPOConfig`` plus the knobs of multi-agent workflow training."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from ..rollout.chat_rendering import CHAT_RENDERINGS, check_chat_rendering
from ..seams.liger import LAYER_KERNELS_ONLY, liger_kernel_unavailable
from ..seams.transformers import add_json_dict_fields, refill_deepspeed_config, rename_checkpointing
from ..seams.trl import check_loss_type
from ..training.mini_batches import MINI_BATCH_ORDERS
from .grpo_config_fields import inapplicable, refusals
from .old_logprobs import OLD_LOGPROBS, old_logprobs_refusals

POLICY_SHARINGS = ("shared", "isolated")
ROLE_LOSS_BALANCES = ("per_output", "per_role")
UPDATE_SCHEDULES = ("merged", "mini_batches")
LR_SCHEDULER_STEPS = ("per_training_step", "per_update")
ADVANTAGE_GROUPS = ("episodes", "roles", "calls")
ROLE_REWARDS = (None, "reference", "own_answers", "balanced")
ROLLOUT_BACKENDS = ("transformers", "vllm")
ROLLOUT_MODES = ("ticks", "async")
# The per-role fields that map a role type to a number (unlisted roles take the global setting)
ROLE_NUMBERS = ("role_loss_weights", "role_beta", "role_entropy_coef", "role_entropy_target", "role_coherence_lambda")


class SettingsWarning(UserWarning):
    """Settings that run, but likely not as meant; the message says what to change. Warnings of this class are ours,
    told apart from upstream's: ``warnings.simplefilter("error", SettingsWarning)`` makes them errors."""


@add_json_dict_fields(
    "role_to_adapter",
    "role_models",
    "role_loss_weights",
    "role_beta",
    "role_entropy_coef",
    "role_entropy_target",
    "role_coherence_lambda",
    "drift_thresholds",
    "role_generation_kwargs",
    "vllm_server_base_urls",  # one JSON object per base model (roles on several bases); else a URL list
    "max_prompt_length",  # one JSON object per workflow class; else a number
)
@dataclass
class MultiAgentGRPOConfig(GRPOConfig):
    """
    Configuration class for the [`MultiAgentGRPOTrainer`]: [`~trl.GRPOConfig`] plus the fields of multi-agent
    workflow training.

    Every `GRPOConfig` parameter keeps its meaning (docs/configuration.md says what the trainer does with each:
    honoured, refused or not applicable); `num_generations` is the number of *workflow episodes* per prompt, and each
    model call of an episode becomes one training sample. The paper's and the toy settings are presets in
    recipes/configs/ (`paper_math.yaml`, `toy.yaml`, ...). Each field's `help` (what `--help` prints) is its short
    form; the fuller description is here.

    Parameters:
        > Parameters that place the roles on adapters and base models

        policy_sharing (`str`, *optional*, defaults to `"shared"`):
            `"shared"`: one LoRA adapter, trained by every role. `"isolated"`: one adapter per role *type* (the three
            voters of Voting share the `generator` adapter). Ignored when `role_to_adapter` is set.
        role_to_adapter (`dict[str, str]`, *optional*):
            Explicit role-to-adapter grouping, e.g. `{"generator": "solver", "evaluator": "judge"}`; it must map every
            role of the workflow. A JSON string is accepted on the command line.
        role_models (`dict[str, str]`, *optional*):
            Base model per role type, e.g. `{"evaluator": "Qwen/Qwen3-0.6B"}`: any `from_pretrained` name or folder,
            or a shipped toy name (`"toy"`). Roles not listed sit on the trainer's `model`. Each distinct base is
            loaded once (with `model_init_kwargs`), with its own tokenizer and chat template, and gets the trainer's
            `peft_config`; `policy_sharing` and `role_to_adapter` apply within a base (under shared policy, one
            adapter per base: `shared` on `model`, `shared-<name>` on another base). One optimizer steps every
            adapter of every base. DDP works; under DeepSpeed (ZeRO-2, ZeRO-3) one engine holds every base. Not with
            `cast_lm_head_to_fp32`. A JSON string is accepted on the command line.

        > Parameters that control the update

        role_loss_weights (`dict[str, float]`, *optional*):
            Multiplier of each role type's loss (policy term and KL term). Roles not listed weigh `1.0`; `0.0`
            freezes a role, also under shared policy.
        role_loss_balance (`str`, *optional*, defaults to `"per_output"`):
            `"per_output"`: every model call weighs the same (three voters outweigh one aggregator). `"per_role"`:
            every role type gets the same total share of the loss, whatever its number of calls and, for token-level
            loss types, tokens.
        update_schedule (`str`, *optional*, defaults to `"merged"`):
            How the samples of one training step update the adapters. `"merged"`: TRL's step, every adapter takes one
            optimizer step on all its samples. `"mini_batches"`: each adapter's samples are cut, in the order
            `mini_batch_order` gives, into mini-batches of `mini_batch_prompts * num_generations` samples, and each
            mini-batch is one optimizer step at the current weights (log-probs recorded once, before the first), one
            adapter after the other, each clipped on its own; a short last mini-batch is scaled by its size over the
            full size. A parallel role then takes several steps per training step from its data volume (three
            voters: three steps). Needs `num_iterations=1`; under DeepSpeed each mini-batch's last backward steps the
            engine, its adapter alone (docs/scaling.md). The learning-rate scheduler steps as `lr_scheduler_steps`
            says. Under either schedule the logged gradient norms are the training step's:
            `grad_norm` is the norm over every adapter's gradient of all the step's updates before clipping (the
            square root of the sum of each update's squared norm), each `adapter/<name>/grad_norm` is over its
            updates the same way, and the step's `grad_norm_share`s add up to 1 (docs/monitoring.md).
        mini_batch_prompts (`int`, *optional*):
            Prompts per mini-batch, over all processes, under `update_schedule="mini_batches"`. Defaults to the
            prompts of one generation batch, so that a role with one call per episode takes one step per training
            step.
        mini_batch_order (`str`, *optional*, defaults to `"episodes"`):
            Which samples make up each mini-batch under `update_schedule="mini_batches"`. `"episodes"`: each adapter's
            samples in episode order, the adapters in the order of the workflow's roles. `"reference"`: the whole
            batch is first reordered by length so that every process gets a similar load (one partition per process
            by the largest differencing method, each laid out from short to long and back to short, process 0's
            first), each adapter's samples keep that order, the adapters update in the order they first appear in it
            (so does the scheduler under `lr_scheduler_steps="per_update"`), and every process cuts its contiguous
            share of them into its part of each mini-batch; on one process a role's middle mini-batch holds its
            longest samples. No effect under `"merged"`, where one step takes every sample.
        old_logprobs (`str`, *optional*, defaults to `"recompute"`):
            Where the loss's log-probs from before the update come from, for the samples whose policy ratio is not
            exactly 1 (under `"mini_batches"` every mini-batch after its adapter's first; under `"merged"` every
            sample, when a generation batch takes several optimizer steps or `num_iterations > 1`). `"recompute"`:
            a no-grad forward of those samples before the first update (the reference's `compute_log_prob`).
            `"rollout"`: the rollout backend's log-prob of each sampled token (vLLM's `processed_logprobs`; the
            transformers backend reads them while it generates), no forward. Refused where they are not the trainer's
            log-probs or change nothing: with `vllm_importance_sampling_correction` (its ratio would be 1),
            `rollout_ahead`, `"merged"` with one optimizer step per generation batch, continuous batching, a
            repetition penalty, a role's own temperature, and on vLLM top-k, top-p or min-p. The adapter check then
            compares no log-probs (its version stamps still run); a custom backend must report them
            (`GenerationResult.sampling_logprobs`).
        lr_scheduler_steps (`str`, *optional*, defaults to `"per_training_step"`):
            When the learning-rate scheduler steps. `"per_training_step"`: the Trainer's own, once per optimizer step
            of the Trainer (the schedule spans `max_steps` training steps). `"per_update"`: once per adapter update
            call: with k adapters the schedule advances k times per training step (1 under shared policy) over the
            same `max_steps` horizon, and the cosine is not clamped past its end, so a 500-step cosine reaches 0 at
            step 250 with k = 2 and rises back to the peak by step 500. Under `update_schedule="mini_batches"` each
            adapter's run of mini-batches is one call (the next adapter trains at the next rate); under `"merged"`
            the one optimizer step counts as k calls. Not with `reduce_lr_on_plateau`.
        prompts_per_step (`int`, *optional*):
            Prompts per training step over all processes. When set, `per_device_train_batch_size` is derived from it:
            `prompts_per_step * num_generations / (num_processes * gradient_accumulation_steps)` episodes per process
            and micro-step, so that a step trains the same episodes, and `update_schedule="mini_batches"` takes the
            same optimizer steps, on any number of processes (an error names the process counts that divide it);
            leave `generation_batch_size` and `steps_per_generation` unset. `None`: TRL's sizes, which grow with the
            number of processes.
        max_tokens_per_micro_batch (`int`, *optional*):
            Memory bound of one forward/backward: micro-batches hold at most `per_device_train_batch_size` samples
            and at most this many padded tokens (prompt + completion), with exact gradient accumulation, whatever the
            number of calls per episode. `None`: no token bound.
        activation_memory_gb (`float`, *optional*):
            Memory the activations of one training forward may take. Set, forwards hold at most the tokens whose
            activations fit it (estimated from the model's shape, training/recompute.py) and run without gradient
            checkpointing; a sample too long to fit alone recomputes where `gradient_checkpointing` is on. `None`
            (default): `gradient_checkpointing` applies to every forward, as in TRL.
        mix_adapters_in_forward (`bool`, *optional*, defaults to `False`):
            `False`: each forward of the loss and log-probs holds one adapter's samples (PEFT's plain LoRA path, each
            adapter's samples padded on their own); `True`: one forward routes each sample to its adapter (PEFT's
            mixed-batch path, fewer forwards, more gather/scatter). Gradients are the same either way.
        clip_grad_norm_per_adapter (`bool`, *optional*, defaults to `False`):
            Clip each adapter's gradient to `max_grad_norm` on its own instead of the norm over all adapters. Always
            the case under `update_schedule="mini_batches"`, where every step updates one adapter. Under DeepSpeed
            with `"merged"`, each adapter's param group is clipped in the engine's optimizer step and the engine's own
            clipping is off (docs/scaling.md).
        role_beta (`dict[str, float]`, *optional*):
            KL coefficient toward the base model (adapters bypassed) per role type. Roles not listed use `beta`.
        role_entropy_coef (`dict[str, float]`, *optional*):
            Coefficient of TRL's entropy bonus per role type (the loss less the coefficient times the mean per-token
            entropy, over each role's own tokens); roles not listed use `entropy_coef`. Under `use_adaptive_entropy`,
            the role's starting coefficient. A role's loss weight multiplies it.
        role_entropy_target (`dict[str, float]`, *optional*):
            Target entropy (nats per token) of TRL's adaptive entropy control (`use_adaptive_entropy`) per role type:
            each role has its own controller, measured on its own tokens once per training step; roles not listed
            use `entropy_target`.
        role_coherence_lambda (`dict[str, float]`, *optional*):
            Gradient coherence damping per role: its adapter's gradient is scaled by
            `1 - lambda * clamp(cos(g, EMA), 0, 1)` before clipping, at every optimizer step (lambda <= 0.3
            recommended). The EMA starts as the first gradient (the first step is damped by `1 - lambda`) and follows
            the damped gradients. Roles sharing an adapter must share lambda.
        role_coherence_window (`int`, *optional*, defaults to `10`):
            Window of the coherence EMA, in optimizer steps: it decays by `1 - 1/window` per optimizer step.

        > Parameters that control the rewards and advantages

        advantage_groups (`str`, *optional*, defaults to `"episodes"`):
            GRPO groups. `"episodes"`: the episodes of one prompt form a group and every call carries its episode's
            advantage (TRL's statistics: std with eps 1e-4). `"calls"`: every call is one sample with its own reward,
            grouped per prompt and `Workflow.group_key` (the role; Voting's math voters apart): all of a role's calls
            over a prompt's episodes, Eval-Opt's repeated attempts and Orch-Workers' workers included, form one group;
            mean and unbiased std with eps 1e-6, a group of one keeps its raw score. `"roles"`: one group per prompt,
            role and instance, a role instance's calls in an episode pooled into one value first (their mean), a
            group of one gets 0; it weighs episodes, not calls, where roles repeat.
        role_rewards (`str`, *optional*):
            Built-in per-role rewards, read from the workflow's declared role formats and graded by `reward_funcs`
            (`trl_multiagent/training/role_rewards.py`). `"reference"`: an answer (generator, voter, synthesizer)
            rewarded when it is right, a verdict when it matches whether the attempt it judged is right (an
            unreadable verdict 0), a selection when the answer it chose is right, or as the workflow's
            `Workflow.role_reward_policy` says: by the episode's outcome, or 0. `"own_answers"`: every role by its own
            output, nothing zeroed: workers by their own answers, a plan by the episode's outcome, an unreadable
            verdict read as Incorrect. `"balanced"`: `"reference"` with each judge's verdicts class-balanced over the
            batch: with n graded verdicts of the role, n_c of them judging an attempt whose truth is c (right or
            wrong) and C truths present, a right verdict gets n / (C * n_c), a wrong one 0, so the batch mean is the
            judge's balanced accuracy and always answering "Correct" earns 0.5 whatever the base rate. Per call under
            `advantage_groups="calls"`, pooled per role trajectory otherwise; logged as `role/<role>/role_reward`.
            Custom ones: the trainer's `role_reward_funcs`.
        role_reward_weight (`float`, *optional*, defaults to `1.0`):
            A call with a per-role reward gets `(1 - w) * outcome advantage + w * role advantage`, both in the groups
            of `advantage_groups`. 1: the role reward replaces the outcome; 0: outcome only.

        > Parameters that control the rollouts

        rollout_backend (`str`, *optional*, defaults to `"transformers"`):
            Engine that generates role outputs. `"transformers"` batches every pending call of a tick into one
            `generate` with per-sample adapters (or, with `use_transformers_continuous_batching`, one `generate_batch`
            per adapter). `"vllm"` (needs `vllm`) serves every role adapter as a vLLM LoRA, synced after each
            optimizer step: in this process with `vllm_mode="colocate"`, or through `vllm serve --enable-lora`
            servers at `vllm_server_base_url` (or `vllm_server_base_urls`) with `vllm_mode="server"`. TRL's
            `use_vllm=True` selects `"vllm"`; TRL's `vllm_*` fields apply, `vllm_importance_sampling_correction`
            included.
        rollout_mode (`str`, *optional*, defaults to `"ticks"`):
            How episodes reach the backend. `"ticks"`: every pending call of every episode goes out as one batch and
            no episode moves on until the whole batch has returned (the only mode of the transformers backend).
            `"async"` (needs `rollout_backend="vllm"`): each call goes to vLLM the moment its episode makes it and the
            episode resumes when its own result arrives, while vLLM batches continuously; colocated, vLLM's `AsyncLLM`
            runs in this process's child process.
        rollout_ahead (`int`, *optional*, defaults to `0`):
            `1`: generate the next generation batch while training on the current one (bounded off-policy: the batch
            a step trains on was sampled with the adapters of one optimizer step earlier;
            `vllm_importance_sampling_correction` reweighs it). Needs `rollout_backend="vllm"`,
            `update_schedule="merged"` and one process.
        rollout_batch_size (`int`, *optional*):
            Largest batch sent to one `generate` call (the colocated vLLM engine's `max_num_seqs`); `None` sends all
            pending calls of a tick at once.
        rollout_max_batch_tokens (`int`, *optional*):
            Memory bound of one `generate` call of the transformers backend: its prompts x (longest prompt + max new
            tokens), the KV cache it can reach, stays within this many tokens (prompts are grouped shortest first; a
            call longer than the budget on its own runs alone, with a warning). `None`: no token bound. The vLLM
            backend manages its own cache (`vllm_gpu_memory_utilization`).
        max_prompt_length (`int` or `dict[str, int]`, *optional*):
            The most tokens a model call's prompt may have, counted as the model is given it (rendered and
            tokenized). A call over it is not sent: its episode ends there and leaves training whole (no sample from
            any of its calls, no reward; the other episodes of its prompt make up the GRPO groups). When set,
            `workflow/dropped_episodes` counts those episodes per step. One number for every workflow, or one per
            workflow class, e.g. `{"EvalOpt": 30720, "SingleAgent": 15360}` (a subclass takes its parent's; a
            workflow not named has no limit), so that one preset serves every recipe. `None`: no limit. TRL 1.16's
            `GRPOConfig` has no such field (older releases had a `max_prompt_length` that cut prompts from the
            left); nothing is cut here.
        role_generation_kwargs (`dict[str, dict]`, *optional*):
            Sampling settings per role type, overriding the run's for that role's calls, e.g.
            `{"evaluator": {"temperature": 0.3, "max_tokens": 512, "stop": ["</verdict>"]}}`. Keys: `temperature`
            (`0` is greedy), `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_tokens`, `stop` (a completion
            ending on a stop string keeps it). Honoured by both rollout backends. A JSON string is accepted on the
            command line.
        chat_rendering (`str`, *optional*, defaults to `"tokenizer"`):
            How a call's messages become its prompt, in every rollout backend. `"tokenizer"`: the tokenizer's chat
            template with `chat_template_kwargs`. `"reference_qwen"` (the paper preset): Qwen's default system prompt
            ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") before every call that does not
            start with a system message, and an empty think block opening every assistant turn, the earlier ones as
            well as the generation prompt (Qwen3's own template with `enable_thinking=False` adds neither to earlier
            turns, nor the system prompt). Needs a tokenizer with Qwen's `<|im_start|>`/`<|im_end|>` tokens.
        tool_timeout (`float`, *optional*, defaults to `30.0`):
            Seconds one tool call may take; a call that takes longer becomes a tool turn holding the timeout error (a
            sync tool is left to finish on its worker thread). Tool loops stop after `max_tool_calling_iterations`
            rounds of tools (None: no cap); the turns since the role's first prompt (its completions and the tool
            outputs) hold at most its `max_tokens` (`role_generation_kwargs`, else `max_completion_length`) tokens:
            tool outputs that would pass it are dropped and end the loop, and each call after tool outputs generates
            at most what is left, as TRL bounds its tool-calling completion.

        > Parameters that control the vLLM servers

        vllm_server_base_urls (`list[str]` or `dict[str, list[str]]`, *optional*):
            Several `vllm serve` servers (data-parallel copies, e.g. one per node) to balance rollouts over, instead
            of `vllm_server_base_url`. Every server receives every adapter update; an episode's calls stay on the
            server that took its first call (its prefix cache). With roles on several base models (`role_models`),
            map each base to its servers: `{"Qwen/Qwen3-1.7B": ["http://node0:8000"], "Qwen/Qwen3-0.6B":
            ["http://node0:8001"]}`; each base's adapters go to its own servers. On the command line:
            `http://node0:8000,http://node1:8000`, a JSON list, a JSON object, or
            `Qwen/Qwen3-1.7B=http://node0:8000,Qwen/Qwen3-0.6B=http://node0:8001` (a base named twice has two
            servers).
        vllm_server_max_concurrency (`int`, *optional*, defaults to `256`):
            Most requests in flight per server; further calls wait for a slot.
        vllm_request_timeout (`float`, *optional*, defaults to `600.0`):
            Seconds one generation request may take before the rollout fails naming the server; a refused connection
            or a 502/503/504 is retried with backoff (0.5 to 4 s, 5 tries), a timeout is not.
        vllm_server_failover (`bool`, *optional*, defaults to `False`):
            With several `vllm serve` servers (`vllm_server_base_urls`): when one stops answering (its process died,
            its engine died, it stalled past `vllm_request_timeout`, or it restarted without the adapters), send its
            calls, those in flight and all later ones, to the others and go on training, with a warning and the
            metric `rollout/servers_down`; between steps, each server out of rotation is asked for its `/health`, and
            once it answers it gets the current adapters and takes calls again. Training stops when no server is
            left. `False`: the first failed server stops training, with an error that names it, the newest complete
            checkpoint and the command that resumes from it.

        > Parameters that control monitoring

        monitor_role_grad_norms (`bool`, *optional*, defaults to `False`):
            Log `role/<role>/grad_norm` and its share also for roles that share an adapter (under shared policy):
            each such role trains a shadow copy of the adapter whose gradient is summed back before the step, so the
            update is unchanged, at the cost of mixed-adapter forward passes.
        monitor_update_size (`bool`, *optional*, defaults to `False`):
            Log `role/<role>/update_ratio` and `update_chi_square` every training step: the mean ratio of the policy
            after the step's optimizer updates to the policy before its first, over the step's own sampled tokens,
            and the mean of (ratio - 1)^2. That is the policy ratio the role's next forward on these tokens would
            start from: the size of the step's update, comparable under both `update_schedule`s (under `'merged'`
            the logged `policy_ratio` is exactly 1). Costs one or two no-grad forward passes of the generation batch;
            the update is unchanged.
        monitor_kl_to_base (`bool`, *optional*, defaults to `False`):
            Log `role/<role>/kl` (KL to the base model) even for roles with no KL penalty; costs one extra no-grad
            forward pass of each generation batch.
        bad_rows (`str`, *optional*, defaults to `"stop"`):
            What a malformed training row does, found when the trainer is built: a prompt missing, empty, not text or
            longer than any model's context (400,000 characters), a column a reward function reads (e.g. `answer`)
            missing or empty, or a row a reward cannot grade (`CodeReward`: tests that do not parse). `"stop"`
            refuses the run, naming the rows and why; `"skip"` leaves them out, names them in a warning, and logs
            their count with every step as `data/skipped_rows`.
        monitor_resources (`bool`, *optional*, defaults to `False`):
            Log `resources/rss_mb`, `open_fds`, `threads`, `child_processes` and `output_dir_mb` with every log line:
            what the training process holds and how large `output_dir` has grown, to spot leaks in long runs (a
            steady climb after the first steps). Costs a walk of `output_dir` per log line.
        drift_alarms (`bool`, *optional*, defaults to `True`):
            Watch every role for the drift signatures of the research (a judge writing code or solver-length outputs,
            length drift, outputs at the length cap, a perplexity or entropy rise before accuracy falls) and log a
            warning and an `alarm/<role>/<kind>` metric when one appears.
        drift_thresholds (`dict[str, float]`, *optional*):
            Overrides of `trl_multiagent.monitoring.DriftThresholds` fields, e.g. `{"length_drift_factor": 2.0}`.
        stop_on_drift (`bool`, *optional*, defaults to `False`):
            Stop training at the first drift alarm, printing the command that resumes from the newest checkpoint with
            the setting the alarm advises (docs/monitoring.md, "Acting on an alarm").
        adapter_mismatch_gap (`float`, *optional*):
            The `adapter_mismatch` check (monitoring/adapter_check.py): a role whose mean |trainer log-prob - sampler
            log-prob| per token (`role/<role>/sampler_gap_mean`, logged where the backend reports sampling log-probs:
            vLLM) is above this many nats was sampled with other weights than its adapter's. `None`: 1e-3 in fp32,
            3e-2 under bf16/fp16 (above the noise measured on the toy model: docs/configuration.md). Raise it for
            samplers that truncate the distribution (top_p < 1, top_k), whose log-probs are renormalised. Where the
            loss needs no log-probs from before the update, the gap costs one extra no-grad forward pass of each
            generation batch.
        adapter_mismatch_outlier (`float`, *optional*, defaults to `10.0`):
            The `adapter_mismatch` check also flags a role whose mean sampler gap is above this times the median of
            the other roles' (and above the precision's noise: 1e-5 in fp32, 1e-2 in bf16/fp16), whatever
            `adapter_mismatch_gap` is.
        fail_on_adapter_mismatch (`bool`, *optional*, defaults to `False`):
            Stop training with an error when a role's calls were not served by its routed adapter at the expected
            version (the optimizer step synced for the batch: the current one, the one before under
            `rollout_ahead=1`) as the backend stamps them, or when its sampler gap crosses the limits above. Without
            it, each such role gets a warning naming the adapter and both versions, and the `adapter_mismatch` alarm
            of `drift_alarms`.
        training_summary (`bool`, *optional*, defaults to `True`):
            When training ends, print how success, the workflow metrics and every per-role metric moved (first vs
            last logged values), and save in `output_dir` `training_summary.png` (success, each role's length,
            entropy and gradient share, each judge's accuracy, the drift alarms; also sent to TensorBoard when
            `report_to` has it) and `trainer_state.json` (the whole log history, which `trl-multiagent report`
            reads).
    """

    policy_sharing: str = field(
        default="shared",
        metadata={
            "help": "`'shared'`: one LoRA adapter trained by every role; `'isolated'`: one adapter per role type "
            "(Voting's voters share `generator`). Ignored when `role_to_adapter` is set.",
            "choices": list(POLICY_SHARINGS),
        },
    )
    role_to_adapter: dict[str, str] | str | None = field(
        default=None,
        metadata={
            "help": 'Role type -> adapter name, e.g. `{"generator": "solver", "evaluator": "judge"}`, naming '
            "every role; replaces `policy_sharing`. JSON on the command line.",
        },
    )
    role_models: dict[str, str] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> base model (name, folder or shipped toy name) for roles not on the trainer's "
            '`model`, e.g. `{"evaluator": "Qwen/Qwen3-0.6B"}`. JSON on the command line.',
        },
    )
    role_loss_weights: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> multiplier of its loss (policy and KL terms); unlisted roles weigh 1.0, 0.0 "
            "freezes a role. JSON on the command line.",
        },
    )
    role_loss_balance: str = field(
        default="per_output",
        metadata={
            "help": "`'per_output'`: every model call weighs the same; `'per_role'`: every role type gets an "
            "equal share of the loss, whatever its number of calls (or tokens, for token-level loss types).",
            "choices": list(ROLE_LOSS_BALANCES),
        },
    )
    update_schedule: str = field(
        default="merged",
        metadata={
            "help": "`'merged'`: one optimizer step per training step on every sample (TRL's); `'mini_batches'`: "
            "each adapter in turn takes one step per mini-batch of `mini_batch_prompts` prompts.",
            "choices": list(UPDATE_SCHEDULES),
        },
    )
    mini_batch_prompts: int | None = field(
        default=None,
        metadata={
            "help": "Prompts per mini-batch, over all processes, under `update_schedule='mini_batches'`; `None`: "
            "the prompts of one generation batch.",
        },
    )
    mini_batch_order: str = field(
        default="episodes",
        metadata={
            "help": "Which samples form each mini-batch: `'episodes'`: each adapter's in episode order; "
            "`'reference'`: the batch balanced by length over processes first (verl's order).",
            "choices": list(MINI_BATCH_ORDERS),
        },
    )
    old_logprobs: str = field(
        default="recompute",
        metadata={
            "help": "Log-probs before the update where the ratio needs them: `'recompute'`: a no-grad forward (the "
            "reference's); `'rollout'`: the rollout backend's sampled-token log-probs, no forward.",
            "choices": list(OLD_LOGPROBS),
        },
    )
    lr_scheduler_steps: str = field(
        default="per_training_step",
        metadata={
            "help": "When the learning-rate scheduler steps: `'per_training_step'` (the Trainer's) or "
            "`'per_update'`: once per adapter update, so k adapters advance it k times per training step.",
            "choices": list(LR_SCHEDULER_STEPS),
        },
    )
    prompts_per_step: int | None = field(
        default=None,
        metadata={
            "help": "Prompts per training step over all processes; `per_device_train_batch_size` is derived so "
            "that a step trains the same episodes on any number of processes. `None`: TRL's sizes.",
        },
    )
    max_tokens_per_micro_batch: int | None = field(
        default=None,
        metadata={
            "help": "Most padded tokens (prompt + completion) in one forward/backward; a larger micro-batch is "
            "split, with exact gradient accumulation. `None`: no token bound.",
        },
    )
    activation_memory_gb: float | None = field(
        default=None,
        metadata={
            "help": "Memory one training forward's activations may take: forwards are cut to fit it and skip "
            "gradient checkpointing (a longer sample alone recomputes). `None`: `gradient_checkpointing` as in TRL.",
        },
    )
    mix_adapters_in_forward: bool = field(
        default=False,
        metadata={
            "help": "`True`: one forward routes each sample to its adapter (fewer forwards); `False`: one forward "
            "per adapter's samples. The gradients are the same either way.",
        },
    )
    advantage_groups: str = field(
        default="episodes",
        metadata={
            "help": "GRPO groups: `'episodes'`: a prompt's episodes, every call with its episode's advantage; "
            "`'calls'`: per prompt and role, each call its own sample; `'roles'`: per prompt, role and instance.",
            "choices": list(ADVANTAGE_GROUPS),
        },
    )
    role_rewards: str | None = field(
        default=None,
        metadata={
            "help": "Built-in per-role rewards, read from the roles' declared formats and graded by "
            "`reward_funcs`: `'reference'`, `'own_answers'` or `'balanced'`. `None`: the outcome reward only.",
            "choices": list(ROLE_REWARDS),
        },
    )
    role_reward_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight w of the role reward, 0 to 1: a call's advantage is `(1 - w) * outcome advantage + w "
            "* role advantage`.",
        },
    )
    clip_grad_norm_per_adapter: bool = field(
        default=False,
        metadata={
            "help": "Clip each adapter's gradient to `max_grad_norm` on its own, not the norm over all adapters "
            "(always so under `update_schedule='mini_batches'`).",
        },
    )
    role_beta: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> KL coefficient toward the base model (adapters bypassed); unlisted roles use "
            "`beta`. JSON on the command line.",
        },
    )
    role_entropy_coef: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> coefficient of TRL's entropy bonus (adaptive: its starting value); unlisted roles "
            "use `entropy_coef`. JSON on the command line.",
        },
    )
    role_entropy_target: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> target entropy of TRL's adaptive entropy control (`use_adaptive_entropy`), each "
            "role its own controller; unlisted roles use `entropy_target`. JSON on the command line.",
        },
    )
    role_coherence_lambda: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> lambda of gradient coherence damping: its adapter's gradient is scaled by `1 - "
            "lambda * clamp(cos(g, EMA), 0, 1)` at every optimizer step (<= 0.3 advised).",
        },
    )
    role_coherence_window: int = field(
        default=10,
        metadata={
            "help": "Window of the coherence EMA, in optimizer steps: it decays by `1 - 1/window` per step.",
        },
    )
    monitor_role_grad_norms: bool = field(
        default=False,
        metadata={
            "help": "Log `role/<role>/grad_norm` also for roles that share an adapter: a shadow copy per role, "
            "the same update, at the cost of mixed-adapter forwards.",
        },
    )
    monitor_update_size: bool = field(
        default=False,
        metadata={
            "help": "Log `role/<role>/update_ratio` and `update_chi_square`: the policy after the step's updates "
            "against before its first, on the step's own tokens (the step's update size under either schedule).",
        },
    )
    monitor_kl_to_base: bool = field(
        default=False,
        metadata={
            "help": "Log `role/<role>/kl` (KL to the base model) also for roles without a KL penalty, at one "
            "extra no-grad forward per generation batch.",
        },
    )
    bad_rows: str = field(
        default="stop",
        metadata={
            "help": "Malformed training rows (named when the trainer is built): `'stop'` refuses the run; `'skip'` "
            "leaves them out and logs `data/skipped_rows`.",
            "choices": ["stop", "skip"],
        },
    )
    monitor_resources: bool = field(
        default=False,
        metadata={
            "help": "Log `resources/*` with every log line: resident memory, open file descriptors, threads, child "
            "processes and the size of `output_dir`, to spot leaks in long runs.",
        },
    )
    drift_alarms: bool = field(
        default=True,
        metadata={
            "help": "Watch every role for drift (a judge writing solutions, length drift, outputs at the length "
            "cap, entropy or perplexity rising): warn and log `alarm/<role>/<kind>`.",
        },
    )
    drift_thresholds: dict[str, float] | str | None = field(
        default=None,
        metadata={
            "help": "Overrides of `trl_multiagent.monitoring.DriftThresholds` fields, e.g. "
            '`{"length_drift_factor": 2.0}`. JSON on the command line.',
        },
    )
    stop_on_drift: bool = field(
        default=False,
        metadata={
            "help": "Stop training at the first drift alarm, printing the command that resumes from the newest "
            "checkpoint with the setting the alarm advises.",
        },
    )
    adapter_mismatch_gap: float | None = field(
        default=None,
        metadata={
            "help": "Nats per token: a role whose mean |trainer - sampler| log-prob gap is above this was sampled "
            "with other weights than its adapter's (vLLM). `None`: 1e-3 in fp32, 3e-2 in bf16/fp16.",
        },
    )
    adapter_mismatch_outlier: float = field(
        default=10.0,
        metadata={
            "help": "Also flag a role whose mean sampler gap is above this many times the median of the other "
            "roles' gaps (and above the precision's noise).",
        },
    )
    fail_on_adapter_mismatch: bool = field(
        default=False,
        metadata={
            "help": "Stop with an error when a role was served by another adapter or version than routed, or its "
            "sampler gap crosses the limits; `False`: a warning and an alarm metric.",
        },
    )
    training_summary: bool = field(
        default=True,
        metadata={
            "help": "When training ends, print how every metric moved and save `training_summary.png` and "
            "`trainer_state.json` in `output_dir`.",
        },
    )
    rollout_backend: str = field(
        default="transformers",
        metadata={
            "help": "Engine that generates role outputs: `'transformers'` (`generate`, adapters mixed in a batch) "
            "or `'vllm'` (every adapter a vLLM LoRA; see `vllm_mode`). `use_vllm=True` selects `'vllm'`.",
            "choices": list(ROLLOUT_BACKENDS),
        },
    )
    rollout_mode: str = field(
        default="ticks",
        metadata={
            "help": "`'ticks'`: every pending call goes out as one batch and episodes wait for it; `'async'` "
            "(vLLM only): each call is sent when made, its episode resuming when it returns.",
            "choices": list(ROLLOUT_MODES),
        },
    )
    rollout_ahead: int = field(
        default=0,
        metadata={
            "help": "`1`: generate the next generation batch while training on this one (one optimizer step "
            "off-policy). Needs `rollout_backend='vllm'`, `update_schedule='merged'` and one process.",
            "choices": [0, 1],
        },
    )
    # `str` second: the command-line parser (HfArgumentParser) reads the flag as text, which `__post_init__` parses.
    vllm_server_base_urls: dict[str, list[str]] | str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Several `vllm serve` URLs to balance rollouts over, each sent every adapter update; with "
            "`role_models`, base model -> URLs. Text: `url,url`, `base=url,...` or JSON.",
        },
    )
    vllm_server_max_concurrency: int = field(
        default=256,
        metadata={
            "help": "Most requests in flight per `vllm serve` server; further calls wait for a slot.",
        },
    )
    vllm_request_timeout: float = field(
        default=600.0,
        metadata={
            "help": "Seconds one generation request may take before the rollout fails naming its server.",
        },
    )
    rollout_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Most calls in one `generate` call (vLLM: its `max_num_seqs`); `None`: every pending call of "
            "a tick at once.",
        },
    )
    max_prompt_length: int | str | dict[str, int] | None = field(
        default=None,
        metadata={
            "help": "Most tokens of a call's rendered prompt; a longer call is not sent and its episode leaves "
            "training. A number, or workflow class -> number (JSON). `None`: no limit.",
        },
    )
    rollout_max_batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Most KV-cache tokens of one transformers `generate` call: prompts x (longest prompt + max "
            "new tokens), grouped shortest first. `None`: no bound.",
        },
    )
    role_generation_kwargs: dict[str, dict[str, Any]] | str | None = field(
        default=None,
        metadata={
            "help": "Role type -> its sampling settings (`temperature`, `top_p`, `top_k`, `min_p`, "
            "`repetition_penalty`, `max_tokens`, `stop`), over the run's. JSON on the command line.",
        },
    )
    chat_rendering: str = field(
        default="tokenizer",
        metadata={
            "help": "How a call's messages become its prompt: `'tokenizer'`: the chat template with "
            "`chat_template_kwargs`; `'reference_qwen'`: the reference stack's Qwen rendering.",
            "choices": list(CHAT_RENDERINGS),
        },
    )
    # Roles with tools (the trainer's `tools` and `role_tools`, a workflow's `tools`); the number of tool rounds per
    # call is TRL's `max_tool_calling_iterations`.
    tool_timeout: float = field(
        default=30.0,
        metadata={
            "help": "Seconds one tool call may take; a slower one becomes a tool turn holding the timeout error.",
        },
    )
    vllm_server_failover: bool = field(
        default=False,
        metadata={
            "help": "With several `vllm serve` servers: send a failed server's calls to the others and train on, "
            "taking it back once healthy. `False`: the first lost server stops training.",
        },
    )

    def __post_init__(self):
        asked_batch_size = self._whole_step_batch()  # before TRL derives its sizes from the per-process batch
        # before transformers reads a JSON object in it, with an error that does not name the field
        self.vllm_server_base_urls = server_urls_setting(self.vllm_server_base_urls)
        # under the name the installed transformers reads: TRL's default and the presets use the old one, which every
        # supported transformers knows (no FutureWarning of our making)
        rename_checkpointing(self)
        super().__post_init__()
        self._split_step_over_processes(asked_batch_size)
        self._check_grpo_config_fields()
        if self.rollout_max_batch_tokens is not None and self.rollout_max_batch_tokens <= (
            self.max_completion_length or 0
        ):
            raise ValueError(
                f"`rollout_max_batch_tokens` ({self.rollout_max_batch_tokens}) must exceed max_completion_length "
                f"({self.max_completion_length}): a generate call holds at least one prompt plus its new tokens."
            )
        if self.policy_sharing not in POLICY_SHARINGS:
            raise ValueError(f"`policy_sharing` must be 'shared' or 'isolated', got {self.policy_sharing!r}.")
        if self.role_loss_balance not in ROLE_LOSS_BALANCES:
            raise ValueError(
                f"`role_loss_balance` must be one of {ROLE_LOSS_BALANCES}, got {self.role_loss_balance!r}."
            )
        if self.update_schedule not in UPDATE_SCHEDULES:
            raise ValueError(f"`update_schedule` must be one of {UPDATE_SCHEDULES}, got {self.update_schedule!r}.")
        if self.mini_batch_order not in MINI_BATCH_ORDERS:
            raise ValueError(f"`mini_batch_order` must be one of {MINI_BATCH_ORDERS}, got {self.mini_batch_order!r}.")
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
        if self.activation_memory_gb is not None and self.activation_memory_gb <= 0:
            raise ValueError(f"`activation_memory_gb` must be > 0 or None, got {self.activation_memory_gb}.")
        batch_prompts = self.generation_batch_size // self.num_generations
        if self.update_schedule == "mini_batches" and (self.mini_batch_prompts or 0) > batch_prompts:
            warnings.warn(
                f"mini_batch_prompts={self.mini_batch_prompts} is more than the {batch_prompts} prompts of one "
                f"generation batch (generation_batch_size {self.generation_batch_size} / num_generations "
                f"{self.num_generations}): every adapter takes a single optimizer step per training step, so a "
                "parallel role gets none of the reference schedule's extra steps. Set mini_batch_prompts to at most "
                f"{batch_prompts}, or to None (one generation batch, the reference's ratio: 64 prompts in both).",
                SettingsWarning,
                stacklevel=3,  # the line that built the config
            )
        if self.tool_timeout <= 0:
            raise ValueError(f"`tool_timeout` must be > 0 seconds, got {self.tool_timeout}.")
        if self.role_coherence_window < 1:
            raise ValueError(f"`role_coherence_window` must be >= 1, got {self.role_coherence_window}.")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"`rollout_backend` must be one of {ROLLOUT_BACKENDS}, got {self.rollout_backend!r}.")
        self._check_rollout_fields()
        refused = old_logprobs_refusals(self)
        if refused:
            raise ValueError("\n".join(refused))
        self.max_prompt_length = _prompt_limits(self.max_prompt_length)
        check_chat_rendering(self.chat_rendering, self.chat_template_kwargs)
        for name in ROLE_NUMBERS:
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

    def _check_grpo_config_fields(self) -> None:
        """TRL's fields as grpo_config_fields.py says: ``use_vllm`` selects the vLLM rollouts; a refused field set
        fails, naming what to set instead; a field that does not apply here, set, is said to have no effect."""
        check_loss_type(self.loss_type)  # TRL itself fails on an unknown one only at the first loss
        if self.use_vllm:
            # TRL's switch for its vLLM generation means our vLLM rollouts. It keeps the value set (a script reading it
            # back, the saved config): the trainer keeps TRL's own client from starting (grpo_seam.py).
            self.rollout_backend = "vllm"
        refused = refusals(self)
        if refused:
            raise ValueError(
                "MultiAgentGRPOTrainer does not support these GRPOConfig settings:\n- " + "\n- ".join(refused)
            )
        for line in inapplicable(self):
            warnings.warn(line, SettingsWarning, stacklevel=4)  # the line that built the config
        if self.use_transformers_continuous_batching and (
            self.rollout_backend != "transformers" or self.rollout_batch_size or self.rollout_max_batch_tokens
        ):
            raise ValueError(
                "use_transformers_continuous_batching is the transformers backend's continuous batching, which sizes "
                "its own batches and KV cache (`transformers_continuous_batching_config`: num_blocks, "
                "max_batch_tokens): set rollout_backend='transformers' (vLLM batches continuously already) and leave "
                "rollout_batch_size and rollout_max_batch_tokens unset, or turn it off."
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
            refill_deepspeed_config(self)

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
        if self.vllm_server_base_urls is not None:
            per_base = self.vllm_server_base_urls
            lists = per_base.values() if isinstance(per_base, dict) else [per_base]
            if not per_base or not all(
                urls and all(isinstance(url, str) and url.startswith(("http://", "https://")) for url in urls)
                for urls in lists
            ):
                raise ValueError(
                    "`vllm_server_base_urls` must list http(s) URLs, e.g. ['http://node0:8000', 'http://node1:8000'], "
                    "or map each base model to its own, e.g. {'Qwen/Qwen3-1.7B': ['http://node0:8000'], "
                    f"'Qwen/Qwen3-0.6B': ['http://node0:8001']}}, got {self.vllm_server_base_urls!r}."
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
        if self.vllm_server_failover and (self.rollout_backend != "vllm" or self.vllm_mode != "server"):
            raise ValueError(
                "`vllm_server_failover` moves calls between `vllm serve` servers: set rollout_backend='vllm' and "
                "vllm_mode='server' with several vllm_server_base_urls, or drop it."
            )

    def prompt_limit_for(self, workflow_class: type) -> int | None:
        """The ``max_prompt_length`` of ``workflow_class``'s episodes: the one number, or the mapping's value for the
        nearest class of its ancestry that it names (none: no limit, said in a warning)."""
        if not isinstance(self.max_prompt_length, dict):
            return self.max_prompt_length
        for cls in workflow_class.__mro__:
            if cls.__name__ in self.max_prompt_length:
                return self.max_prompt_length[cls.__name__]
        warnings.warn(
            f"max_prompt_length gives limits for {sorted(self.max_prompt_length)}, not for {workflow_class.__name__} "
            "(nor a class it derives from): its episodes have no prompt limit. Add its class name to the mapping to "
            "give it one.",
            SettingsWarning,
            stacklevel=2,
        )
        return None

    def check_roles(self, roles) -> None:
        """Fail if a per-role field names a role the workflow does not have."""
        for name in ("role_models", *ROLE_NUMBERS):
            unknown = sorted(set(getattr(self, name) or {}) - set(roles))
            if unknown:
                raise ValueError(f"`{name}` names role(s) {unknown}; the workflow's roles are {list(roles)}.")


def config_field(name: str, **metadata: Any) -> Any:
    """A dataclass field declared as `MultiAgentGRPOConfig`'s ``name`` is (default, help, choices), for another parser
    dataclass that takes the same setting (the evaluation's settings); ``metadata`` replaces what differs there."""
    owner = MultiAgentGRPOConfig.__dataclass_fields__[name]
    return field(default=owner.default, default_factory=owner.default_factory, metadata={**owner.metadata, **metadata})


def _prompt_limits(value: Any) -> int | dict[str, int] | None:
    """``max_prompt_length`` as a number or a mapping of workflow class names to numbers (the command line gives
    text), each at least 1."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(
                f"`max_prompt_length` must be a number of tokens or a JSON object of workflow class -> number, e.g. "
                f'\'{{"EvalOpt": 30720, "SingleAgent": 15360}}\', got {value!r}.'
            ) from None
    limits = value.values() if isinstance(value, dict) else [] if value is None else [value]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in limits) or (
        isinstance(value, dict) and not all(isinstance(name, str) and name for name in value)
    ):
        raise ValueError(
            "`max_prompt_length` must be a number of tokens >= 1, or a mapping of workflow class names to such "
            f"numbers, got {value!r}."
        )
    return dict(value) if isinstance(value, dict) else value


def server_urls_setting(value: Any) -> list[str] | dict[str, list[str]] | None:
    """``vllm_server_base_urls`` as the backend reads it: a list of URLs, or base model -> its URLs. Text (the command
    line) is a JSON list or object, ``base=url,base=url`` (a base named twice has several servers), or
    ``url,url``; a mapping's single URL becomes a list of one. Other values are left for the checks that follow."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"`vllm_server_base_urls` is not valid JSON ({error}): {value!r}.") from error
        else:
            items = [item.strip() for item in text.split(",") if item.strip()]
            if not any("=" in item for item in items):
                return items
            value = {}
            for item in items:
                base, equals, url = item.partition("=")
                if not equals or not base.strip() or not url.strip():
                    raise ValueError(
                        f"`vllm_server_base_urls` mixes URLs and base=URL pairs at {item!r}: give "
                        "`base=http://host:port,...` for every server, or URLs only."
                    )
                value.setdefault(base.strip(), []).append(url.strip())
    if isinstance(value, dict):  # base model -> its servers (roles on several bases)
        return {base: [urls] if isinstance(urls, str) else list(urls) for base, urls in value.items()}
    return value


def _check_role_numbers(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict of role -> number (or a JSON object), got {value!r}.")
    for role, number in value.items():
        if not isinstance(number, int | float) or number < 0:
            raise ValueError(f"`{name}[{role!r}]` must be a number >= 0, got {number!r}.")


UNSUPPORTED_TRL_ARGUMENTS = {
    "rollout_func": "`rollout_func`: it replaces GRPOTrainer's generation with one function that returns, per "
    "prompt, the token ids and log-probs of single completions, each one training sample; here the rollout engine "
    "runs the workflow, which may make many model calls per episode, each a training sample of its role, so there is "
    "no single completion for such a function to return",
}


def check_rollout_ahead(args: MultiAgentGRPOConfig, num_processes: int) -> bool:
    """Whether ``rollout_ahead`` is on, once the rest of the run fits it (the config checked the fields alone)."""
    if not args.rollout_ahead:
        return False
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


def check_liger_kernel(args: MultiAgentGRPOConfig) -> None:
    """``use_liger_kernel``: Liger's layer kernels on every base model, where they can run; its loss kernels, which
    would replace the forward that scores completions (TRL's fused LM head), refused as TRL refuses them."""
    unavailable = liger_kernel_unavailable(use_cpu=args.use_cpu)
    if unavailable is not None:
        raise ValueError(f"`use_liger_kernel=True` cannot run here: {unavailable}. Set use_liger_kernel=False.")
    losses = sorted(name for name in LAYER_KERNELS_ONLY if (args.liger_kernel_config or {}).get(name))
    if losses:
        raise ValueError(
            f"`liger_kernel_config` turns on {losses}, which replace the model's forward that TRL patches to score "
            "completions (TRL refuses them too); only Liger's layer kernels (rms_norm, swiglu, rope) apply here. "
            "Drop them from liger_kernel_config."
        )


def check_trainer_arguments(
    args, workflow, model, peft_config, role_reward_funcs=None, unsupported=None
) -> MultiAgentGRPOConfig:
    """``args`` (a default config when None) once the trainer's own arguments are known to fit together."""
    from peft import PeftModel

    from ..workflows.base import Workflow

    for name, value in (unsupported or {}).items():
        what = UNSUPPORTED_TRL_ARGUMENTS.get(name)
        if what is None:
            raise TypeError(f"MultiAgentGRPOTrainer got an unexpected keyword argument {name!r}.")
        if value is not None:
            raise ValueError(
                f"MultiAgentGRPOTrainer does not take {what}. Write the rollout as a Workflow instead: its `run` "
                "calls `generate(role, messages)` per model call and may keep any state per episode; give a role "
                "functions to call with `tools=[...]`, `role_tools={role: [...]}` or the workflow's `tools` (or one "
                "environment per episode with `environment_factory`), and score the final answer with `reward_funcs`."
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
        check_liger_kernel(args)
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
