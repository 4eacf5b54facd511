"""Gradient coherence damping: the formula, its scope (one role), and its state across checkpoints."""

from __future__ import annotations

import pytest
import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent.adapters.coherence import CoherenceDamping


def reference_damping(steps: list[list[torch.Tensor]], weight: float, window: int) -> list[tuple[float, float]]:
    """The reference stack's step-scaling regularizer, written out per parameter as its I6 note describes it
    (docs/multi-agent/interventions/i6-coherence-regularizer.md): an EMA per parameter, lazily a clone of the first
    gradient; cos = sum(g.e) / (sqrt(sum(g.g)) sqrt(sum(e.e)) + 1e-8); scale = 1 - weight * clamp(cos, 0, 1);
    g *= scale; then e = tau e + (1 - tau) g with tau = 1 - 1/window, toward the damped gradient."""
    tau, ema, out = 1.0 - 1.0 / window, None, []
    for grads in steps:
        grads = [g.clone().double() for g in grads]
        if ema is None:
            ema = [g.clone() for g in grads]
        gg = sum(float((g * g).sum()) for g in grads)
        ee = sum(float((e * e).sum()) for e in ema)
        ge = sum(float((g * e).sum()) for g, e in zip(grads, ema))
        cos = ge / (gg**0.5 * ee**0.5 + 1e-8)
        scale = 1.0 - weight * min(max(cos, 0.0), 1.0)
        for g, e in zip(grads, ema):
            g.mul_(scale)
            e.mul_(tau).add_(g, alpha=1.0 - tau)
        out.append((cos, scale))
    return out


def test_damping_matches_the_reference_on_a_fixed_sequence():
    """Four steps of a two-parameter adapter: a first step (cosine 1 against the seed), a step along the EMA, a
    reversal (not damped) and a partly aligned one; window 4 (tau 0.75), lambda 0.3."""
    steps = [
        [torch.tensor([1.0, 0.0]), torch.tensor([[0.5]])],
        [torch.tensor([2.0, 0.5]), torch.tensor([[1.0]])],
        [torch.tensor([-1.0, 0.0]), torch.tensor([[-0.5]])],
        [torch.tensor([0.3, 1.0]), torch.tensor([[0.2]])],
    ]
    expected = reference_damping(steps, weight=0.3, window=4)
    assert expected[0] == pytest.approx((1.0, 0.7)) and expected[2][1] == 1.0  # the cases the sequence covers
    assert 0.0 < expected[3][0] < 1.0 and expected[1][1] < 1.0
    damping = CoherenceDamping({"generator": 0.3}, {"generator": 4})
    for grads, (cos, scale) in zip(steps, expected):
        before = [g.clone() for g in grads]
        got_cos, got_scale = damping.apply("generator", grads)
        assert got_cos == pytest.approx(cos, rel=1e-6, abs=1e-7) and got_scale == pytest.approx(scale, rel=1e-6)
        for g, b in zip(grads, before):
            assert torch.allclose(g, b * scale, rtol=1e-6, atol=0.0)  # damped in place, by the reference's scale


def voting_trainer(tiny_model_dir, output_dir):
    settings = dict(
        per_device_train_batch_size=8,
        max_steps=3,
        save_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        policy_sharing="isolated",
        seed=0,
        role_coherence_lambda={"generator": 0.3},
        role_coherence_window=4,
    )
    return tiny_trainer(tiny_model_dir, output_dir, dataset=addition_dataset(4), respond=random_answers, **settings)


def test_damping_acts_on_its_role_and_resumes_from_checkpoints(tiny_model_dir, tmp_path):
    trainer = voting_trainer(tiny_model_dir, tmp_path / "run")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all("adapter/generator/coherence_scale" in h for h in logs)
    assert all("adapter/aggregator/coherence_scale" not in h for h in logs)
    # The first step compares the gradient with itself (the EMA starts as its copy): cosine 1, damped by 1 - lambda.
    assert logs[0]["adapter/generator/coherence_scale"] == pytest.approx(0.7, abs=1e-5)
    assert any(h["adapter/generator/coherence_scale"] < 1.0 for h in logs[1:])
    state = torch.load(tmp_path / "run" / "checkpoint-2" / "coherence_state.pt")
    assert set(state["ema"]) == {"generator"}

    resumed = voting_trainer(tiny_model_dir, tmp_path / "run")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    last = [h for h in resumed.state.log_history if "loss" in h][-1]
    # The first step after resuming compares with the saved EMA; without it the EMA would restart as a copy of this
    # step's gradient, cosine 1.
    assert last["step"] == 3 and last["adapter/generator/coherence_cos"] < 0.99
