"""What ``MultiAgentGRPOTrainer`` does with each field TRL's ``GRPOConfig`` adds to ``TrainingArguments``.

One entry per field, the one place this is said: ``MultiAgentGRPOConfig`` refuses at construction a refused field
set to a value that would change something, and warns for a field that does not apply here; docs/configuration.md's
table is generated from it (scripts/config_reference.py); tests/trl_compat/test_grpo_config_fields.py fails when the
installed TRL has a field this does not account for, and when an honoured field's test is missing or never sets that
field (read from the test's source, tests/settings_in_tests.py). TRL 1.14.2 and 1.16 have the same 77 fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HONOURED = "honoured"
REFUSED = "refused"
NOT_APPLICABLE = "not applicable"

EFFECTS = "tests/trl_compat/test_grpo_config_fields.py"  # the effect tests of most honoured fields


@dataclass(frozen=True)
class FieldUse:
    """How the trainer uses one ``GRPOConfig`` field."""

    status: str  # HONOURED | REFUSED | NOT_APPLICABLE
    why: str  # honoured: what it does here; refused or not applicable: why
    instead: str = ""  # refused: what to set instead
    test: str = ""  # honoured: the test showing its effect on the trainer (path::name)
    # refused / not applicable: whether a value changes nothing (TRL's default, or another neutral value)
    neutral: Callable[[Any], bool] | None = field(default=None, compare=False)


def honoured(why: str, test: str) -> FieldUse:
    return FieldUse(HONOURED, why, test=test if "::" in test else f"{EFFECTS}::{test}")


def refused(why: str, instead: str, neutral: Callable[[Any], bool] | None = None) -> FieldUse:
    return FieldUse(REFUSED, why, instead=instead, neutral=neutral)


def not_applicable(why: str, neutral: Callable[[Any], bool] | None = None) -> FieldUse:
    return FieldUse(NOT_APPLICABLE, why, neutral=neutral)


SAMPLING = "test_trl_sampling_fields_reach_every_generate_call"
LOSS = "test_trl_loss_fields_change_the_trainers_loss"
VLLM_ENGINE = "test_vllm_fields_reach_the_colocated_engine"
VLLM_SERVER = "test_use_vllm_in_server_mode_reaches_the_server_trl_names"
ENTROPY_BONUS = "tests/training/test_role_entropy.py::test_entropy_coef_raises_the_entropy_of_its_role_only"
ADAPTIVE_ENTROPY = "tests/training/test_role_entropy.py::test_adaptive_entropy_per_role_moves_and_resumes"
REF_SYNC = "only read by TRL's reference-model sync (`sync_ref_model`), refused here"

GRPO_CONFIG_FIELDS: dict[str, FieldUse] = {
    # > Parameters that control the model
    "model_init_kwargs": honoured(
        "loads the trainer's `model` given by name, and every base model of `role_models`",
        "test_model_init_kwargs_and_trust_remote_code_load_every_base",
    ),
    "trust_remote_code": honoured(
        "loads the trainer's model and `role_models` bases with their own code, and the colocated vLLM engine",
        "test_model_init_kwargs_and_trust_remote_code_load_every_base",
    ),
    "router_aux_loss_coef": honoured(
        "TRL's load-balancing loss of MoE models, added to each loss forward; a micro-step here makes one forward per "
        "adapter on MoE models, each adding its own term",
        "test_router_aux_loss_coef_weighs_the_moe_auxiliary_loss",
    ),
    "disable_dropout": honoured(
        "dropout off in the model and in every role adapter (installed after TRL disabled it)",
        "test_disable_dropout_reaches_every_role_adapter",
    ),
    "cast_lm_head_to_fp32": honoured(
        "the trainer's model scores in fp32; refused with `role_models` (the other bases would not be) and on a head "
        "tied to the embeddings (TRL's cast fails on a PEFT model there)",
        "test_cast_lm_head_to_fp32_casts_the_trainers_head",
    ),
    # > Parameters that control the data preprocessing
    "num_generations": honoured(
        "workflow episodes per prompt, each a GRPO group member", "test_episodes_per_prompt_are_num_generations"
    ),
    "num_generations_eval": honoured(
        "episodes per prompt in evaluation",
        "tests/evaluation/test_evaluation_loop.py::test_training_with_eval_strategy_steps_logs_eval_metrics_per_role",
    ),
    "max_completion_length": honoured(
        "most new tokens per model call (a role's `max_tokens` overrides it), in every rollout backend", SAMPLING
    ),
    "ds3_gather_for_generation": honoured(
        "under ZeRO-3, whether the transformers rollout gathers the weights first (TRL's unwrap)",
        "test_ds3_gather_for_generation_reaches_the_unwrap",
    ),
    "shuffle_dataset": honoured(
        "whether prompts reach the rollouts shuffled (TRL's sampler)", "test_shuffle_dataset_false_keeps_dataset_order"
    ),
    "pad_to_multiple_of": honoured(
        "each training forward's width (one sample a row, or packed rows) rounded up to a multiple of it; the "
        "rollout backends pad to their longest row",
        "tests/training/test_forward_padding.py::test_pad_to_multiple_of_widens_every_training_forward",
    ),
    "generation_batch_size": honoured(
        "episodes rolled out per generation batch (or derived from `prompts_per_step`)",
        "test_generation_batch_size_and_steps_per_generation_cut_the_batch",
    ),
    "steps_per_generation": honoured(
        "micro-steps each generation batch is cut into (none dropped)",
        "test_generation_batch_size_and_steps_per_generation_cut_the_batch",
    ),
    # > Parameters that control generation
    "temperature": honoured("sampling temperature of every call, and of the trainer's log-probs", SAMPLING),
    "top_p": honoured("nucleus sampling of every call (a role's own overrides it)", SAMPLING),
    "top_k": honoured("top-k sampling of every call (a role's own overrides it)", SAMPLING),
    "min_p": honoured("min-p sampling of every call (a role's own overrides it)", SAMPLING),
    "generation_kwargs": honoured(
        "extra `GenerationConfig` (transformers) or `SamplingParams` (vLLM) settings of every call", SAMPLING
    ),
    "chat_template_kwargs": honoured(
        "passed to the chat template of every call's prompt",
        "tests/rollout/test_chat_rendering.py::test_chat_template_kwargs_reach_the_prompts_the_trainer_trains_on",
    ),
    "repetition_penalty": honoured("repetition penalty of every call (a role's own overrides it)", SAMPLING),
    "cache_implementation": honoured("the KV cache `generate` builds in the transformers backend", SAMPLING),
    "use_transformers_continuous_batching": honoured(
        "the transformers backend generates each adapter's calls with `generate_batch` (continuous batching)",
        "test_continuous_batching_generates_each_adapters_calls",
    ),
    "transformers_continuous_batching_config": honoured(
        "its `ContinuousBatchingConfig` (TRL's default `max_memory_percent` 0.5)",
        "test_continuous_batching_generates_each_adapters_calls",
    ),
    "use_transformers_paged": honoured(
        "TRL's deprecated name of `use_transformers_continuous_batching` (TRL maps it, with its FutureWarning)",
        "test_continuous_batching_generates_each_adapters_calls",
    ),
    # > Parameters that control generation acceleration powered by vLLM
    "use_vllm": honoured(
        "selects the vLLM rollouts: `rollout_backend='vllm'`; it reads `True` afterwards and in the saved config, and "
        "TRL's own single-completion client is not started",
        VLLM_SERVER,
    ),
    "vllm_mode": honoured("`'colocate'`: an engine in each process; `'server'`: `vllm serve` servers", VLLM_SERVER),
    "vllm_model_impl": honoured("the colocated engine's model implementation", VLLM_ENGINE),
    "vllm_enable_sleep_mode": refused(
        "the colocated engine serves every role adapter and is synced after each optimizer step; putting it to sleep "
        "during the update, and waking it with every adapter, is not implemented until a GPU test can show it",
        "lower `vllm_gpu_memory_utilization`, or serve with `vllm serve` (`vllm_mode='server'`)",
    ),
    "vllm_structured_outputs_regex": refused(
        "one regex would constrain every call of every role alike, though roles answer in different formats",
        "let the workflow's role formats parse the outputs; a role's `stop` strings go in `role_generation_kwargs`",
    ),
    "vllm_server_base_url": honoured("the `vllm serve` server of `vllm_mode='server'`", VLLM_SERVER),
    "vllm_server_host": honoured("the server's host when `vllm_server_base_url` is unset", VLLM_SERVER),
    "vllm_server_port": honoured("the server's port when `vllm_server_base_url` is unset", VLLM_SERVER),
    "vllm_server_timeout": honoured("seconds to wait for the server to answer `/health` at start-up", VLLM_SERVER),
    "vllm_group_port": not_applicable(
        "the port of TRL's NCCL weight-sync group with `trl vllm-serve`; here the role adapters reach `vllm serve` "
        "over HTTP"
    ),
    "vllm_gpu_memory_utilization": honoured(
        "GPU memory share of the colocated engine (split evenly between the engines of several bases)", VLLM_ENGINE
    ),
    "vllm_max_model_length": honoured("the colocated engine's context length", VLLM_ENGINE),
    "vllm_tensor_parallel_size": refused(
        "a colocated engine runs one copy per training process; one split over GPUs is untested until a multi-GPU "
        "test can show it, and a server's parallelism is set where it starts",
        "tensor parallelism: `vllm serve --tensor-parallel-size N` and `vllm_mode='server'`; leave this at 1",
        neutral=lambda value: value == 1,
    ),
    # > Parameters that control the training
    "beta": honoured(
        "KL coefficient toward the base model of every role without its own `role_beta`",
        "tests/training/test_role_knobs.py::test_beta_anchors_every_role_without_its_own_role_beta",
    ),
    "num_iterations": honoured(
        "passes over each generation batch (log-probs before the update recorded)",
        "test_num_iterations_trains_each_generation_batch_again",
    ),
    "epsilon": honoured("lower clipping bound of TRL's loss", LOSS),
    "delta": honoured("upper bound of the ratio in TRL's two-sided loss", LOSS),
    "epsilon_high": honoured("upper clipping bound of TRL's loss (and cispo's ratio cap)", LOSS),
    "sapo_temperature_neg": honoured("`loss_type='sapo'`: temperature of non-positive advantages", LOSS),
    "sapo_temperature_pos": honoured("`loss_type='sapo'`: temperature of positive advantages", LOSS),
    "vespo_k_pos": honoured("`loss_type='vespo'`: power of positive advantages", LOSS),
    "vespo_lambda_pos": honoured("`loss_type='vespo'`: decay of positive advantages", LOSS),
    "vespo_k_neg": honoured("`loss_type='vespo'`: power of negative advantages", LOSS),
    "vespo_lambda_neg": honoured("`loss_type='vespo'`: decay of negative advantages", LOSS),
    "importance_sampling_level": honoured("token- or sequence-level ratios of TRL's loss and the per-role KL", LOSS),
    "reward_weights": honoured(
        "weights of the reward functions in each episode's outcome",
        "tests/trl_compat/test_trl_compat.py::test_logged_reward_is_the_weighted_outcome",
    ),
    "multi_objective_aggregation": honoured(
        "how several reward functions combine before the advantages",
        "tests/trl_compat/test_trl_compat.py::test_normalize_then_sum_trains",
    ),
    "scale_rewards": honoured(
        "the std the advantages are divided by (group, batch or none)", "test_scale_rewards_scales_the_advantages"
    ),
    "loss_type": honoured("TRL's loss and its reduction; a type TRL does not list is refused at construction", LOSS),
    "mask_truncated_completions": honoured(
        "calls cut at their length limit train nothing", "test_mask_truncated_completions_leaves_cut_calls_out"
    ),
    "sync_ref_model": refused(
        "the KL anchor is the base model, reached by routing samples to no adapter: there is no reference copy to "
        "sync (TRL refuses it with PEFT too)",
        "leave it `False`; anchor a role with `role_beta`",
    ),
    "ref_model_mixup_alpha": not_applicable(REF_SYNC),
    "ref_model_sync_steps": not_applicable(REF_SYNC),
    "top_entropy_quantile": honoured("TRL's loss keeps the highest-entropy tokens only", LOSS),
    "entropy_coef": honoured(
        "TRL's entropy bonus (the loss less it times the mean per-token entropy), per role with "
        "`role_entropy_coef`; each forward's mean weighs by its share of the step's tokens",
        ENTROPY_BONUS,
    ),
    "use_adaptive_entropy": honoured(
        "TRL's adaptive entropy control, one controller per role type on its own tokens, once per training step; "
        "its state is saved in checkpoints",
        ADAPTIVE_ENTROPY,
    ),
    "entropy_coef_min": honoured("lower bound of each role's adaptive coefficient", ADAPTIVE_ENTROPY),
    "entropy_coef_max": honoured("upper bound of each role's adaptive coefficient", ADAPTIVE_ENTROPY),
    "entropy_coef_delta": honoured("step of each role's adaptive coefficient", ADAPTIVE_ENTROPY),
    "entropy_target": honoured("target entropy of every role without its own `role_entropy_target`", ADAPTIVE_ENTROPY),
    "max_tool_calling_iterations": honoured(
        "most tool rounds of one role call",
        "tests/rollout/test_tools.py::test_max_tool_calling_iterations_bounds_the_trainers_tool_loops",
    ),
    "vllm_importance_sampling_correction": honoured(
        "reweighs vLLM-sampled calls by the trainer's over the sampler's probability",
        "test_vllm_sampling_correction_reweighs_the_calls",
    ),
    "vllm_importance_sampling_mode": honoured(
        "token or sequence ratios, truncated or masked", "test_vllm_importance_sampling_fields_shape_the_ratio"
    ),
    "vllm_importance_sampling_clip_max": honoured(
        "upper bound of the ratio", "test_vllm_importance_sampling_fields_shape_the_ratio"
    ),
    "vllm_importance_sampling_clip_min": honoured(
        "lower bound of the ratio", "test_vllm_importance_sampling_fields_shape_the_ratio"
    ),
    "vllm_importance_sampling_cap": honoured(
        "TRL's deprecated name of `vllm_importance_sampling_clip_max` (TRL maps it, with its FutureWarning)",
        "test_vllm_importance_sampling_fields_shape_the_ratio",
    ),
    "off_policy_mask_threshold": honoured(
        "TRL's loss drops negative-advantage calls that drifted further from the sampler", LOSS
    ),
    "use_bias_correction_kl": honoured(
        "the per-role KL term is multiplied by the importance ratio",
        "test_use_bias_correction_kl_weighs_the_kl_term_by_the_ratio",
    ),
    # > Parameters that control the logging
    "log_completions": honoured(
        "TRL's completions table, one row per episode with each role's outputs as columns",
        "test_completion_logging_fields_shape_trls_table",
    ),
    "log_multimodal": not_applicable("no image reaches a role (vision-language models are refused)"),
    "num_completions_to_print": honoured(
        "rows of the completions table printed", "test_completion_logging_fields_shape_trls_table"
    ),
    "log_unique_prompts": honoured(
        "one completions-table row per prompt in wandb and trackio", "test_completion_logging_fields_shape_trls_table"
    ),
    "log_completions_hub_repo": honoured(
        "uploads the completions tables to a Hub dataset", "test_completion_logging_fields_shape_trls_table"
    ),
}


def default_of(name: str) -> Any:
    """``GRPOConfig``'s default of field ``name``."""
    from trl import GRPOConfig

    declared = GRPOConfig.__dataclass_fields__[name]
    return declared.default_factory() if declared.default is dataclasses.MISSING else declared.default


def changes_something(name: str, value: Any) -> bool:
    """Whether ``value`` of refused or inapplicable field ``name`` would change what TRL does by default."""
    use = GRPO_CONFIG_FIELDS[name]
    return not (use.neutral(value) if use.neutral is not None else value == default_of(name))


def refusals(config) -> list[str]:
    """One line per refused field ``config`` sets: the field, its value, why, and what to set instead."""
    return [
        f"`{name}={getattr(config, name)!r}`: {use.why}. Instead: {use.instead}."
        for name, use in GRPO_CONFIG_FIELDS.items()
        if use.status == REFUSED and changes_something(name, getattr(config, name))
    ]


def inapplicable(config) -> list[str]:
    """One line per field ``config`` sets that does not apply here: the field, its value, and why."""
    return [
        f"`{name}={getattr(config, name)!r}` has no effect here: {use.why}."
        for name, use in GRPO_CONFIG_FIELDS.items()
        if use.status == NOT_APPLICABLE and changes_something(name, getattr(config, name))
    ]
