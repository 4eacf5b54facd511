"""``MultiAgentGRPOConfig``: TRL's ``GRPOConfig`` plus the knobs of multi-agent workflow training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

ROLE_LOSS_BALANCES = ("per_output", "per_role")
PARALLEL_ROLE_STEPS = ("merged", "per_instance")
ROLLOUT_BACKENDS = ("transformers", "vllm")


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

        > Parameters that control the loss

        role_loss_weights (`dict[str, float]` or `str`, *optional*):
            Multiplier of each role type's loss (policy term and KL term). Roles not listed weigh `1.0`; `0.0` freezes
            a role, also under shared policy.
        role_loss_balance (`str`, *optional*, defaults to `"per_output"`):
            `"per_output"`: every model call weighs the same (the reference behaviour: three voters outweigh one
            aggregator). `"per_role"`: every role type gets the same total share of the loss, whatever its number of
            calls and, for token-level loss types, tokens.
        parallel_role_steps (`str`, *optional*, defaults to `"merged"`):
            For a role with several parallel instances per episode (the voters of Voting, the workers of
            Orch-Workers) whose adapter serves that role alone: `"merged"` takes one optimizer step per training step
            on all instances' samples; `"per_instance"` takes one step per instance, on that instance's samples (the
            reference stack's behaviour, which the research ties to the isolated policy's late decline).
        role_beta (`dict[str, float]` or `str`, *optional*):
            KL coefficient toward the base model (adapters bypassed) per role type. Roles not listed use `beta`.

        role_coherence_lambda (`dict[str, float]` or `str`, *optional*):
            Gradient coherence damping per role: its adapter's gradient is scaled by
            `1 - lambda * max(0, cos(g, EMA(g)))` before clipping (lambda <= 0.3 recommended). Roles sharing an
            adapter must share lambda.
        role_coherence_window (`int`, *optional*, defaults to `10`):
            Number of steps the gradient EMA of coherence damping averages over.
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
        rollout_batch_size (`int`, *optional*):
            Largest batch sent to one `generate` call; `None` sends all pending calls of a tick at once.
        role_generation_kwargs (`dict[str, dict]` or `str`, *optional*):
            Sampling settings per role type, overriding the run's for that role's calls, e.g.
            `{"evaluator": {"temperature": 0.3, "max_tokens": 512, "stop": ["</verdict>"]}}`. Keys: `temperature`
            (`0` is greedy), `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_tokens`, `stop` (a completion
            ending on a stop string keeps it). Honoured by both rollout backends. A JSON string is accepted on the
            command line.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + [
        "role_to_adapter",
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
    parallel_role_steps: str = field(
        default="merged",
        metadata={
            "help": "'merged': one optimizer step per parallel role per training step; 'per_instance': one per "
            "instance.",
            "choices": list(PARALLEL_ROLE_STEPS),
        },
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
    rollout_batch_size: int | None = field(
        default=None,
        metadata={"help": "Largest batch of one generate call; None sends all pending calls of a tick at once."},
    )
    role_generation_kwargs: dict[str, dict[str, Any]] | str | None = field(
        default=None,
        metadata={
            "help": "Sampling settings per role type (JSON on the command line), e.g. "
            '\'{"evaluator": {"temperature": 0.3, "max_tokens": 512, "stop": ["</verdict>"]}}\'.'
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.policy_sharing not in ("shared", "isolated"):
            raise ValueError(f"`policy_sharing` must be 'shared' or 'isolated', got {self.policy_sharing!r}.")
        if self.role_loss_balance not in ROLE_LOSS_BALANCES:
            raise ValueError(
                f"`role_loss_balance` must be one of {ROLE_LOSS_BALANCES}, got {self.role_loss_balance!r}."
            )
        if self.parallel_role_steps not in PARALLEL_ROLE_STEPS:
            raise ValueError(
                f"`parallel_role_steps` must be one of {PARALLEL_ROLE_STEPS}, got {self.parallel_role_steps!r}."
            )
        if self.role_coherence_window < 1:
            raise ValueError(f"`role_coherence_window` must be >= 1, got {self.role_coherence_window}.")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"`rollout_backend` must be one of {ROLLOUT_BACKENDS}, got {self.rollout_backend!r}.")
        if self.rollout_backend == "vllm" and self.vllm_mode == "colocate" and self.vllm_tensor_parallel_size != 1:
            raise ValueError(
                "A colocated vLLM rollout engine runs one copy per process (`vllm_tensor_parallel_size=1`); for "
                "tensor parallelism start `vllm serve --tensor-parallel-size N` and set `vllm_mode='server'`."
            )
        for name in ("role_loss_weights", "role_beta", "role_coherence_lambda"):
            _check_role_numbers(name, getattr(self, name))
        if self.role_to_adapter is not None and not isinstance(self.role_to_adapter, dict):
            raise ValueError(f"`role_to_adapter` must be a dict (or JSON object), got {self.role_to_adapter!r}.")
        if self.use_vllm:
            raise ValueError(
                "`use_vllm` drives TRL's single-completion generation, which multi-agent rollouts do not use. "
                "Choose the rollout engine with `rollout_backend` instead."
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "Workflow advantages are grouped over episode outcomes with `multi_objective_aggregation="
                "'sum_then_normalize'`; other aggregations are not supported."
            )


def _check_role_numbers(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict of role -> number (or a JSON object), got {value!r}.")
    for role, number in value.items():
        if not isinstance(number, int | float) or number < 0:
            raise ValueError(f"`{name}[{role!r}]` must be a number >= 0, got {number!r}.")
