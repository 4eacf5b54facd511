"""Gradient coherence damping: the formula, its scope (one role), and its state across checkpoints."""

from __future__ import annotations

import pytest
import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent.adapters.coherence import CoherenceDamping


def test_scale_is_one_minus_lambda_times_positive_cosine():
    damping = CoherenceDamping({"generator": 0.3}, {"generator": 3})  # EMA decay 0.5
    first = [torch.tensor([1.0, 0.0])]
    assert damping.apply("generator", first) == (0.0, 1.0)  # no history: untouched
    same = [torch.tensor([2.0, 0.0])]
    cosine, scale = damping.apply("generator", same)
    assert cosine == pytest.approx(1.0) and scale == pytest.approx(0.7)
    assert torch.allclose(same[0], torch.tensor([1.4, 0.0]))
    opposite = [torch.tensor([-1.0, 0.0])]
    cosine, scale = damping.apply("generator", opposite)
    assert cosine == pytest.approx(-1.0) and scale == 1.0  # a change of direction is never damped
    # EMA after three steps with decay 0.5: 0.5 * (0.5 * 1 + 0.5 * 2) + 0.5 * (-1) = 0.25
    assert torch.allclose(damping.ema["generator"], torch.tensor([0.25, 0.0]))


def voting_trainer(tiny_model_dir, output_dir):
    settings = dict(
        per_device_train_batch_size=8, max_steps=3, save_steps=2, logging_steps=1, learning_rate=1e-2,
        policy_sharing="isolated", seed=0, role_coherence_lambda={"generator": 0.3}, role_coherence_window=4,
    )  # fmt: skip
    return tiny_trainer(tiny_model_dir, output_dir, dataset=addition_dataset(4), respond=random_answers, **settings)


def test_damping_acts_on_its_role_and_resumes_from_checkpoints(tiny_model_dir, tmp_path):
    trainer = voting_trainer(tiny_model_dir, tmp_path / "run")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all("adapter/generator/coherence_scale" in h for h in logs)
    assert all("adapter/aggregator/coherence_scale" not in h for h in logs)
    assert logs[0]["adapter/generator/coherence_scale"] == 1.0  # no history at the first step
    assert any(h["adapter/generator/coherence_scale"] < 1.0 for h in logs[1:])
    state = torch.load(tmp_path / "run" / "checkpoint-2" / "coherence_state.pt")
    assert set(state["ema"]) == {"generator"}

    resumed = voting_trainer(tiny_model_dir, tmp_path / "run")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    last = [h for h in resumed.state.log_history if "loss" in h][-1]
    # The first step after resuming compares with the saved EMA; without it there is no history and cos is 0.
    assert last["step"] == 3 and last["adapter/generator/coherence_cos"] != 0.0
