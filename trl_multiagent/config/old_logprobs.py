"""`old_logprobs`: where the loss's log-probs from before the update come from, and the settings that cannot honour
``"rollout"``.

``"recompute"`` (the reference's: rLLM's trainer runs verl's `compute_log_prob` on every sample before the update) runs
a no-grad forward of the samples whose policy ratio is not exactly one: the mini-batches after each adapter's first
under `update_schedule="mini_batches"`, every sample under `"merged"` when a generation batch takes several optimizer
steps or `num_iterations > 1`. ``"rollout"`` takes the rollout backend's log-prob of each sampled token instead (vLLM's
`processed_logprobs`; the transformers backend's read while it generates), so no forward runs. They are the trainer's
log-probs at the weights that sampled only where the sampler scores tokens as the trainer does: the run's temperature,
no penalty, and for vLLM no top-k, top-p or min-p (which renormalise its log-probs). Up to rounding between the two
engines (bf16 vLLM against the trainer: the `sampler_gap_mean` the adapter check logs), the update is the same.
"""

from __future__ import annotations

from typing import Any

OLD_LOGPROBS = ("recompute", "rollout")
_OFF = {"top_p": (1.0, None), "top_k": (0, -1, None), "min_p": (0.0, None)}  # vLLM's truncations, off


def old_logprobs_refusals(args: Any) -> list[str]:
    """Why ``args`` (a `MultiAgentGRPOConfig` past TRL's own checks) cannot take `old_logprobs="rollout"`; empty when
    it can, or under `"recompute"`."""
    if args.old_logprobs not in OLD_LOGPROBS:
        return [f"`old_logprobs` must be one of {OLD_LOGPROBS}, got {args.old_logprobs!r}"]
    if args.old_logprobs != "rollout":
        return []
    found = []
    if args.vllm_importance_sampling_correction:
        found.append(
            "TRL's `vllm_importance_sampling_correction` (on by default) reweighs by the trainer's log-probs before "
            "the update over the sampler's, which are then the same: a ratio of 1. Set "
            "vllm_importance_sampling_correction=False (the paper preset does)"
        )
    if args.rollout_ahead:
        found.append(
            "rollout_ahead=1 samples with the weights of one step before and needs the trainer's log-probs to correct "
            "for it; set rollout_ahead=0"
        )
    elif (
        args.update_schedule == "merged"
        and args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0
    ):
        found.append(
            "under update_schedule='merged' with one optimizer step per generation batch the loss uses no log-probs "
            "from before the update (its ratio is exactly 1), so there is nothing to take from the rollout; set "
            "update_schedule='mini_batches', or steps_per_generation above gradient_accumulation_steps"
        )
    if args.use_transformers_continuous_batching:
        found.append(
            "transformers' continuous batching (`generate_batch`) reports no log-probs; set "
            "use_transformers_continuous_batching=False"
        )
    found += [f"{where} sets {setting}, {why}" for where, setting, why in _sampling_conflicts(args)]
    return [f"old_logprobs='rollout': {reason}, or set old_logprobs='recompute'." for reason in found]


def _sampling_conflicts(args: Any) -> list[tuple[str, str, str]]:
    """(where, setting, why) for every sampling setting under which the sampler's log-probs are not the trainer's."""
    settings = [("the config", _run_sampling(args))]
    roles = args.role_generation_kwargs or {}
    settings += [(f"role_generation_kwargs[{role!r}]", kwargs) for role, kwargs in roles.items()]
    if args.generation_kwargs:
        settings.append(("generation_kwargs", dict(args.generation_kwargs)))
    found = []
    for where, kwargs in settings:
        penalty = kwargs.get("repetition_penalty")
        if penalty not in (1.0, None):
            found.append((where, f"repetition_penalty={penalty}", "which the trainer's log-probs do not apply"))
        temperature = kwargs.get("temperature", args.temperature)
        if where != "the config" and temperature != args.temperature:
            found.append((where, f"temperature={temperature}", f"and the trainer scores at {args.temperature}"))
        if args.rollout_backend == "vllm":
            for name, off in _OFF.items():
                if kwargs.get(name) not in off:
                    found.append((where, f"{name}={kwargs[name]}", "under which vLLM's log-probs are renormalised"))
    return found


def _run_sampling(args: Any) -> dict[str, Any]:
    return {name: getattr(args, name) for name in ("repetition_penalty", *_OFF)}
