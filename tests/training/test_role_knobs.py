"""Role loss balance and per-role KL anchors act on the roles they name, and only on them."""

from __future__ import annotations

import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.training.loss_weights import role_weights


def test_per_role_balance_gives_each_role_type_an_equal_share():
    roles = ["generator", "generator", "generator", "aggregator"] * 5  # 5 Voting episodes
    tokens = torch.tensor([30.0, 10.0, 20.0, 5.0] * 5)
    for loss_type in ("grpo", "dapo"):  # sequence-level and token-level aggregation
        weights = role_weights(roles, tokens, role_loss_weights={}, balance="per_role", loss_type=loss_type)
        size = tokens if loss_type == "dapo" else torch.ones_like(tokens)
        share = {r: float(sum(weights[i] * size[i] for i, x in enumerate(roles) if x == r)) for r in set(roles)}
        assert abs(share["generator"] - share["aggregator"]) < 1e-4
        assert abs(sum(share.values()) - float(size.sum())) < 1e-3  # the total loss scale is unchanged
    per_output = role_weights(
        roles, tokens, role_loss_weights={"aggregator": 0.5}, balance="per_output", loss_type="grpo"
    )
    assert per_output.tolist() == [1.0, 1.0, 1.0, 0.5] * 5


def voting_run(tiny_model_dir, tmp_path, before_train=None, **overrides):
    settings = dict(
        per_device_train_batch_size=8,
        max_steps=3,
        logging_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        policy_sharing="isolated",
        seed=0,
    )
    settings.update(overrides)
    trainer = tiny_trainer(tiny_model_dir, tmp_path, dataset=addition_dataset(4), respond=random_answers, **settings)
    trainer.initial_weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    if before_train is not None:
        before_train(trainer)
    trainer.train()
    return trainer


def test_role_beta_acts_only_on_its_role(tiny_model_dir, tmp_path):
    # Global grad-norm clipping would couple the adapters (one role's KL gradient rescales every role's step).
    plain = voting_run(tiny_model_dir, tmp_path / "plain", max_grad_norm=0.0)
    anchored = voting_run(tiny_model_dir, tmp_path / "anchored", role_beta={"aggregator": 1.0}, max_grad_norm=0.0)
    for role, should_differ in (("generator", False), ("aggregator", True)):
        a, b = adapter_parameters(plain.model, role), adapter_parameters(anchored.model, role)
        gap = max((a[n] - b[n]).abs().max().item() for n in a)
        assert (gap > 1e-6) == should_differ, (role, gap)
    logs = [h for h in anchored.state.log_history if "role/aggregator/kl" in h]
    assert logs and logs[-1]["role/aggregator/kl"] > 0


def test_beta_anchors_every_role_without_its_own_role_beta(tiny_model_dir, tmp_path):
    """TRL's `beta` is the default of every role's anchor; a role's `role_beta` (here 0 for the aggregator) wins."""
    plain = voting_run(tiny_model_dir, tmp_path / "plain", max_grad_norm=0.0)
    anchored = voting_run(
        tiny_model_dir, tmp_path / "anchored", beta=1.0, role_beta={"aggregator": 0.0}, max_grad_norm=0.0
    )
    for role, should_differ in (("generator", True), ("aggregator", False)):
        a, b = adapter_parameters(plain.model, role), adapter_parameters(anchored.model, role)
        gap = max((a[n] - b[n]).abs().max().item() for n in a)
        assert (gap > 1e-6) == should_differ, (role, gap)
    logs = [h for h in anchored.state.log_history if "role/generator/kl" in h]
    assert logs and logs[-1]["role/generator/kl"] > 0


def test_zero_weight_under_shared_policy_equals_training_without_that_role(tiny_model_dir, tmp_path):
    """The shared adapter's update with aggregator weight 0 equals its update from the voters' samples alone."""
    # Plain SGD, so each update is the gradient itself: with weight 0 the aggregator's 8 samples still count in
    # the per-sample mean over 32, so the update is 24/32 of the update from the 24 voter samples alone.
    common = dict(policy_sharing="shared", max_steps=1, optim="sgd", max_grad_norm=0.0)
    weighted = voting_run(tiny_model_dir, tmp_path / "weighted", role_loss_weights={"aggregator": 0.0}, **common)

    def without_aggregator(trainer):
        score = trainer._generate_and_score

        def filtered(inputs):
            batch = score(inputs)
            keep = torch.tensor([r != "aggregator" for r in batch.roles])
            out = batch.select(keep)
            out.num_samples_in_batch = keep.sum().float()
            out.num_items_in_batch = out.completion_mask.sum().float()
            return out

        trainer._generate_and_score = filtered

    dropped = voting_run(tiny_model_dir, tmp_path / "dropped", before_train=without_aggregator, **common)
    a, b = adapter_parameters(weighted.model, "shared"), adapter_parameters(dropped.model, "shared")
    update_a = {n: a[n] - weighted.initial_weights[n] for n in a}
    update_b = {n: b[n] - dropped.initial_weights[n] for n in b}
    assert max(u.abs().max().item() for u in update_a.values()) > 1e-5
    assert max((update_a[n] - 24 / 32 * update_b[n]).abs().max().item() for n in a) < 1e-7
