"""Per-role training metrics appear in the logs under both sharing modes."""

from __future__ import annotations

import math

import pytest
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent import MultiAgentGRPOTrainer, Voting
from trl_multiagent.adapters.gradient_accounts import GradientNorms
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.monitoring.role_metrics import grad_norm_metrics, update_metrics

ROLLOUT_KEYS = ("calls", "completion_length", "truncated_fraction", "advantage")
LOSS_KEYS = ("kl", "entropy", "perplexity", "policy_ratio", "chi_square", "clip_fraction")


def train_voting(tiny_model_dir, output_dir, **config) -> MultiAgentGRPOTrainer:
    """Two steps of Voting on the tiny model with scripted answers, ``config`` added to the shared settings."""
    # The wording the 1e-5 tolerance below was set on: with the paper set's longer requests, monitored and plain
    # updates differ by 7.7e-5 after two Adam steps at lr 5e-2 (summation order of the role shadows' gradients).
    settings = dict(
        per_device_train_batch_size=8, max_steps=2, logging_steps=1, learning_rate=5e-2, save_strategy="no"
    )
    trainer = tiny_trainer(
        tiny_model_dir,
        output_dir,
        Voting(prompts="guarded"),
        dataset=addition_dataset(4),
        respond=random_answers,
        **settings,
        **config,
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("sharing", ["shared", "isolated"])
def test_role_metrics_logged(tiny_model_dir, tmp_path, sharing):
    trainer = train_voting(
        tiny_model_dir,
        tmp_path,
        policy_sharing=sharing,
        steps_per_generation=2,
        monitor_kl_to_base=True,
        gradient_accumulation_steps=1,
    )
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for role in ("generator", "aggregator"):
        for key in ROLLOUT_KEYS:  # logged when the generation batch is made (every second step here)
            assert math.isfinite(logs[0][f"role/{role}/{key}"]), (role, key)
        for key in LOSS_KEYS:  # logged from every optimizer step's loss
            assert all(math.isfinite(h[f"role/{role}/{key}"]) for h in logs), (role, key)
    # Two optimizer steps per generation: the second trains on samples from before the first update.
    assert logs[1]["role/generator/policy_ratio"] != 1.0 and logs[1]["role/generator/chi_square"] > 0
    shares = [v for k, v in logs[0].items() if k.startswith("adapter/") and k.endswith("grad_norm_share")]
    assert abs(sum(shares) - 1.0) < 1e-6
    if sharing == "isolated":
        assert logs[0]["role/generator/grad_norm"] == logs[0]["adapter/generator/grad_norm"]


def test_role_gradient_contributions_under_shared_policy(tiny_model_dir, tmp_path):
    plain = train_voting(tiny_model_dir, tmp_path / "plain", policy_sharing="shared", monitor_role_grad_norms=False)
    monitored = train_voting(
        tiny_model_dir, tmp_path / "monitored", policy_sharing="shared", monitor_role_grad_norms=True
    )
    a, b = adapter_parameters(plain.model, "shared"), adapter_parameters(monitored.model, "shared")
    assert max((a[n] - b[n]).abs().max().item() for n in a) < 1e-5  # monitoring leaves the update unchanged
    logs = [h for h in monitored.state.log_history if "loss" in h]
    for h in logs:
        shares = h["role/generator/grad_norm_share"] + h["role/aggregator/grad_norm_share"]
        assert abs(shares - 1.0) < 1e-6 and h["role/generator/grad_norm"] > 0 and h["role/aggregator/grad_norm"] > 0
    assert all("role/generator/grad_norm" not in h for h in plain.state.log_history)
    assert sorted(monitored.model.peft_config) == ["shared", "shared__role_aggregator", "shared__role_generator"]


@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_role_shares_within_a_shared_adapter_add_up_to_one(tiny_model_dir, tmp_path, schedule):
    """Shared Voting with role shadows: each role's norm is over the step's updates (one merged step, or a mini-batch
    step per prompt), and its share of the squared total adds up to 1 over the roles of the adapter."""
    trainer = train_voting(
        tiny_model_dir,
        tmp_path,
        policy_sharing="shared",
        monitor_role_grad_norms=True,
        update_schedule=schedule,
        mini_batch_prompts=1,
    )
    for h in [h for h in trainer.state.log_history if "loss" in h]:
        if schedule == "mini_batches":
            assert h["adapter/shared/optimizer_steps"] > 1
        squares = {role: h[f"role/{role}/grad_norm"] ** 2 for role in ("generator", "aggregator")}
        assert all(squares.values())
        for role, square in squares.items():
            assert h[f"role/{role}/grad_norm_share"] == pytest.approx(square / sum(squares.values()), rel=1e-6)
        assert sum(h[f"role/{role}/grad_norm_share"] for role in squares) == pytest.approx(1.0, abs=1e-12)
        assert h["adapter/shared/grad_norm_share"] == 1.0


def test_step_metrics_add_the_updates_up():
    """Two updates of one step, a mini-batch per adapter: norms over both, shares of the summed squares; coherence
    values are the means over the updates that damped."""
    roles = {"writer": "writer", "critic": "critic"}
    updates = [
        GradientNorms({"writer": 9.0, "critic": 0.0}, {}, {"writer": (0.5, 0.9)}),
        GradientNorms({"writer": 16.0, "critic": 75.0}, {}, {"writer": (0.1, 0.7), "critic": (0.2, 0.8)}),
    ]
    metrics = update_metrics(updates, roles)
    assert metrics["adapter/writer/grad_norm"] == metrics["role/writer/grad_norm"] == 5.0
    assert metrics["adapter/critic/grad_norm"] == pytest.approx(75.0**0.5)
    assert metrics["adapter/writer/grad_norm_share"] == metrics["role/writer/grad_norm_share"] == 0.25
    assert metrics["adapter/critic/grad_norm_share"] == metrics["role/critic/grad_norm_share"] == 0.75
    assert metrics["adapter/writer/coherence_cos"] == pytest.approx(0.3)
    assert metrics["adapter/writer/coherence_scale"] == pytest.approx(0.8)
    assert metrics["adapter/critic/coherence_cos"] == 0.2
    assert update_metrics([], roles) == {}  # nothing measured (DeepSpeed): no metric


def test_a_share_of_nothing_or_of_an_unknown_total_is_not_logged():
    isolated = {"writer": "writer", "critic": "critic"}
    nothing = grad_norm_metrics({"writer": 0.0, "critic": 0.0}, isolated, {})
    assert nothing == {
        f"{kind}/{name}/grad_norm": 0.0 for kind in ("adapter", "role") for name in ("writer", "critic")
    }
    # Two roles share an adapter without role shadows: the lone role's norm is known, its share of all roles is not.
    roles = {"writer": "shared", "editor": "shared", "critic": "critic"}
    partial = grad_norm_metrics({"shared": 4.0, "critic": 1.0}, roles, {})
    assert partial["role/critic/grad_norm"] == 1.0 and "role/critic/grad_norm_share" not in partial
    assert partial["adapter/critic/grad_norm_share"] == 0.2
    measured = grad_norm_metrics({"shared": 4.0, "critic": 1.0}, roles, {"writer": 1.0, "editor": 2.0})
    assert [measured[f"role/{r}/grad_norm_share"] for r in ("writer", "editor", "critic")] == [0.25, 0.5, 0.25]
