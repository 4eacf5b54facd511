"""`old_logprobs="rollout"`: the loss's log-probs from before the update are the ones the rollout backend read while it
sampled, not a forward's. The transformers backend's are the trainer's own forward's at the same weights (fp32, within
`TOLERANCE`); under the switch no log-prob forward runs before the update, and the first step's update is the one the
recomputed log-probs give; settings under which the sampler's log-probs are not the trainer's are refused."""

from __future__ import annotations

import pytest
import torch
from test_forward_padding import record_gradients, uneven_answers
from test_logps_before_update import record_logp_samples
from tiny import ONE_SGD_STEP, tiny_config, tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters

# Nats per token: `generate`'s cached steps on left-padded rows against one forward of each whole sequence, in fp32
# (measured: at most 1.8e-5, 2.5e-6 on average, on log-probs down to -8; another adapter's are ~9 nats off).
TOLERANCE = 5e-5
ROLLOUT = dict(old_logprobs="rollout", vllm_importance_sampling_correction=False)


def length_reward(completions, **kwargs) -> list[float]:
    """The tiny model writes no answers: a reward by the answer's length, so that every group has a learning signal."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(text) % 5) for text in texts]


def distinct_adapters(trainer, scale: float = 0.5) -> None:
    """Random LoRA weights, other for each adapter (PEFT starts every `lora_B` at zero: each adapter is the base
    model), so that a log-prob of another adapter's, or of the base model's, is far from the right one."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for adapter in trainer._updates.installed.adapter_names:
            for name, weight in adapter_parameters(trainer.model, adapter).items():
                if "lora_B" in name:
                    weight.copy_(torch.randn(weight.shape, generator=generator) * scale)


def record_plan(trainer) -> list:
    """The mini-batches of every step, (adapter, mini-batch), as they train."""
    plan, updates = [], trainer._adapter_steps.mini_batch_updates

    def recording(steps, **kwargs):
        plan.extend(steps)
        return updates(steps, **kwargs)

    trainer._adapter_steps.mini_batch_updates = recording
    return plan


def generating_trainer(model_dir, output_dir, policy: str, **config):
    """Eval-Opt whose rollouts the tiny model generates (the transformers backend), mini-batches of one prompt's
    episodes: two per adapter and step, so every adapter has a mini-batch after its first."""
    return tiny_trainer(
        model_dir,
        output_dir,
        EvalOpt(max_iterations=2),
        reward_funcs=length_reward,
        policy_sharing=policy,
        update_schedule="mini_batches",
        mini_batch_prompts=1,
        gradient_accumulation_steps=2,
        temperature=0.7,
        **ONE_SGD_STEP,
        **config,
    )


def test_the_transformers_backends_log_probs_are_the_trainers_forwards(tiny_model_dir, tmp_path):
    """Every sampled token's log-prob as the backend read it while generating (temperature 0.7, two adapters mixed in
    each `generate`) is the trainer's own forward's at the same weights, through the sample's adapter; through the
    other adapter it is not, so the tolerance tells adapters apart."""
    trainer = generating_trainer(tiny_model_dir, tmp_path, "isolated", **ROLLOUT)
    distinct_adapters(trainer)
    seen, score = [], trainer._generate_and_score

    def scoring(inputs):
        batch = score(inputs)
        with torch.no_grad():  # before the step's first update: the weights that sampled
            own = trainer._step_forwards.routed_logps(batch, batch.adapters, "train")
            other = {"generator": "evaluator", "evaluator": "generator"}
            swapped = trainer._step_forwards.routed_logps(batch, [other[a] for a in batch.adapters], "train")
        seen.append((batch, own, swapped))
        return batch

    trainer._generate_and_score = scoring
    trainer.train()
    (batch, own, swapped), mask = seen[0], seen[0][0].completion_mask.bool()
    assert set(batch.adapters) == {"generator", "evaluator"} and mask.sum() > 50
    gap = (batch.sampling_per_token_logps - own)[mask].abs().max().item()
    assert gap <= TOLERANCE, gap
    assert (batch.sampling_per_token_logps - swapped)[mask].abs().mean().item() > 1000 * TOLERANCE


@pytest.mark.parametrize("policy", ["isolated", "shared"])
def test_no_log_prob_forward_before_the_update_and_the_same_update(tiny_model_dir, tmp_path, policy):
    """One step of the same generated episodes, recomputed and from the rollout: the rollout's run no log-prob forward
    before the update, its later mini-batches carry the rollout's log-probs, and the adapters' gradients at every
    optimizer step and the logged loss are the recomputed run's."""
    runs = {}
    for old in ("recompute", "rollout"):
        trainer = generating_trainer(tiny_model_dir, tmp_path / old, policy, **{**ROLLOUT, "old_logprobs": old})
        gradients = record_gradients(trainer)
        samples = record_logp_samples(trainer, gradients)
        plan = record_plan(trainer)
        trainer.train()
        runs[old] = gradients, trainer.state.log_history[0]["loss"], samples, plan
    recomputed, rollout = runs["recompute"], runs["rollout"]
    assert sum(recomputed[2]) > 0 and rollout[2] == []
    assert len(rollout[3]) > len({adapter for adapter, _ in rollout[3]})  # mini-batches after each adapter's first
    for (_, ours), (_, theirs) in zip(rollout[3], recomputed[3]):
        assert torch.equal(ours.completion_ids, theirs.completion_ids)  # the same episodes, the same mini-batches
        if theirs.old_per_token_logps is None:
            assert ours.old_per_token_logps is None  # an adapter's first: ratio exactly 1 either way
        else:
            assert torch.equal(ours.old_per_token_logps, ours.sampling_per_token_logps)
    # The adapters' gradients at every optimizer step within 1e-4 of the largest (as test_forward_padding.py compares
    # updates); the logged loss, a mean of advantage x ratio terms that nearly cancel (the advantages, under 2 here,
    # sum to zero per group), within what a log-prob gap of TOLERANCE moves it.
    scale = max(g.abs().max().item() for step in recomputed[0] for g in step.values())
    assert scale > 0 and len(rollout[0]) == len(recomputed[0]) > 2
    for ours, theirs in zip(rollout[0], recomputed[0]):
        assert ours.keys() == theirs.keys()
        assert max((ours[name] - theirs[name]).abs().max().item() for name in theirs) <= 1e-4 * scale
    assert rollout[1] == pytest.approx(recomputed[1], abs=2 * TOLERANCE)


@pytest.mark.parametrize(
    "settings, refusal",
    [
        ({"old_logprobs": "rollout"}, "vllm_importance_sampling_correction=False"),
        ({"old_logprobs": "forward"}, "must be one of"),
        ({**ROLLOUT, "update_schedule": "merged"}, "nothing to take from the rollout"),
        ({**ROLLOUT, "use_transformers_continuous_batching": True}, "use_transformers_continuous_batching=False"),
        ({**ROLLOUT, "repetition_penalty": 1.1}, "repetition_penalty=1.1"),
        ({**ROLLOUT, "role_generation_kwargs": {"evaluator": {"temperature": 0.0}}}, "temperature=0.0"),
        ({**ROLLOUT, "rollout_backend": "vllm", "top_p": 0.9}, "top_p=0.9, under which vLLM's log-probs"),
        ({**ROLLOUT, "rollout_backend": "vllm", "role_generation_kwargs": {"evaluator": {"top_k": 5}}}, "top_k=5"),
        ({**ROLLOUT, "rollout_backend": "vllm", "update_schedule": "merged", "rollout_ahead": 1}, "rollout_ahead=0"),
    ],
)
def test_settings_that_cannot_honour_rollout_log_probs_are_refused(tmp_path, settings, refusal):
    with pytest.raises(ValueError, match=refusal) as refused:
        tiny_config(tmp_path, **{"update_schedule": "mini_batches", **settings})
    assert "old_logprobs='recompute'" in str(refused.value) or "must be one of" in refusal


@pytest.mark.parametrize(
    "settings",
    [
        {"update_schedule": "mini_batches"},
        {"update_schedule": "merged", "steps_per_generation": 2},  # two optimizer steps per generation batch
        {"update_schedule": "mini_batches", "top_p": 0.9, "top_k": 5},  # transformers: read before the warpers
    ],
)
def test_settings_that_honour_rollout_log_probs_are_taken(tmp_path, settings):
    assert tiny_config(tmp_path, **ROLLOUT, **settings).old_logprobs == "rollout"


def test_a_backend_that_reports_no_log_probs_stops_the_step(tiny_model_dir, tmp_path):
    """Scripted rollouts carry no log-probs: the first step stops, naming the backend and the fix."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        respond=uneven_answers,
        update_schedule="mini_batches",
        max_steps=1,
        save_strategy="no",
        **ROLLOUT,
    )
    with pytest.raises(ValueError, match="ScriptedBackend returned calls without them.*old_logprobs='recompute'"):
        trainer.train()


def test_merged_steps_of_one_generation_batch_take_every_samples_rollout_log_probs(tiny_model_dir, tmp_path):
    """Under `"merged"` with two optimizer steps per generation batch every sample's ratio needs its log-probs from
    before the update: under the switch they are the rollout's, for every sample, and no log-prob forward runs."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        reward_funcs=length_reward,
        update_schedule="merged",
        steps_per_generation=2,
        max_steps=2,
        learning_rate=0.05,
        save_strategy="no",
        seed=0,
        **ROLLOUT,
    )
    forward, score, batches, forwards = trainer._step_forwards.routed_logps, trainer._generate_and_score, [], []

    def counting(batch, adapters, mode):
        forwards.append(len(batch))
        return forward(batch, adapters, mode)

    def scoring(inputs):
        batches.append(score(inputs))
        return batches[-1]

    trainer._step_forwards.routed_logps, trainer._generate_and_score = counting, scoring
    trainer.train()
    assert len(batches) == 1 and trainer.state.global_step == 2 and forwards == []
    (batch,) = batches
    assert batch.old_per_token_logps is batch.sampling_per_token_logps is not None
