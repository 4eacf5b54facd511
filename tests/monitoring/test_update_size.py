"""`monitor_update_size`: how far each training step's updates moved each role's policy, on the step's own tokens."""

from __future__ import annotations

import math

import pytest
import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent import Voting
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.monitoring.update_size import update_size_metrics, update_size_sums


def test_sums_are_masked_token_means_per_role():
    before = torch.zeros(3, 2)
    after = torch.tensor([[math.log(2.0), 0.0], [0.0, 5.0], [math.log(0.5), math.log(1.5)]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])  # the second sample's second token is padding
    roles = ["writer", "critic", "idle"]
    sums = update_size_sums(roles, ["writer", "critic", "writer"], before=before, after=after, mask=mask)
    metrics = update_size_metrics(roles, sums)
    # writer's tokens: ratios 2, 1, 0.5, 1.5; critic's: 1 (its padded token left out); idle has no tokens
    assert metrics["role/writer/update_ratio"] == pytest.approx(5.0 / 4)
    assert metrics["role/writer/update_chi_square"] == pytest.approx((1 + 0 + 0.25 + 0.25) / 4)
    assert metrics["role/critic/update_ratio"] == 1.0 and metrics["role/critic/update_chi_square"] == 0.0
    assert not any(key.startswith("role/idle/") for key in metrics)


def train(tiny_model_dir, output_dir, **config):
    trainer = tiny_trainer(
        tiny_model_dir,
        output_dir,
        Voting(prompts="guarded"),
        dataset=addition_dataset(4),
        respond=random_answers,
        per_device_train_batch_size=8,
        max_steps=2,
        logging_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        policy_sharing="isolated",
        role_loss_weights={"aggregator": 0.0},  # its own adapter, never moved
        **config,
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_a_step_that_moves_a_role_shows_in_its_update_size_only(tiny_model_dir, tmp_path, schedule):
    trainer = train(tiny_model_dir, tmp_path, update_schedule=schedule, mini_batch_prompts=1, monitor_update_size=True)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:
        assert h["role/generator/update_chi_square"] > 1e-6 and h["role/generator/update_ratio"] != 1.0
        assert h["role/aggregator/update_ratio"] == pytest.approx(1.0, abs=1e-7)
        assert h["role/aggregator/update_chi_square"] == pytest.approx(0.0, abs=1e-12)
        if schedule == "merged":  # one update per step: the loss's own ratio cannot see it
            assert h["role/generator/policy_ratio"] == 1.0


def test_measuring_leaves_the_update_unchanged(tiny_model_dir, tmp_path):
    plain = train(tiny_model_dir, tmp_path / "plain")
    measured = train(tiny_model_dir, tmp_path / "measured", monitor_update_size=True)
    a, b = adapter_parameters(plain.model, "generator"), adapter_parameters(measured.model, "generator")
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert all("role/generator/update_ratio" not in h for h in plain.state.log_history)
