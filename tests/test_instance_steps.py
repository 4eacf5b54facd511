"""Parallel roles under isolated policy: one optimizer step per instance, or one merged step."""

from __future__ import annotations

import pytest
import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent.adapters.routing import adapter_parameters


def voting_trainer(tiny_model_dir, tmp_path, **overrides):
    settings = dict(
        per_device_train_batch_size=8, max_steps=2, logging_steps=1, learning_rate=5e-2, save_strategy="no",
        policy_sharing="isolated", seed=0, max_grad_norm=0.0,
    )  # fmt: skip
    settings.update(overrides)
    return tiny_trainer(tiny_model_dir, tmp_path, dataset=addition_dataset(4), respond=random_answers, **settings)


def optimizer_steps(trainer, adapter: str) -> set[int]:
    state = trainer.optimizer.optimizer.state if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer.state
    return {int(state[p]["step"]) for p in adapter_parameters(trainer.model, adapter).values() if p in state}


@pytest.mark.parametrize("mode, generator_steps", [("per_instance", 3), ("merged", 1)])
def test_optimizer_steps_per_adapter(tiny_model_dir, tmp_path, mode, generator_steps):
    trainer = voting_trainer(tiny_model_dir, tmp_path, parallel_role_steps=mode)
    trainer.train()
    assert trainer.state.global_step == 2
    assert optimizer_steps(trainer, "generator") == {2 * generator_steps}  # 2 training steps
    assert optimizer_steps(trainer, "aggregator") == {2}
    # Shadows are never optimised themselves and never saved; they mirror their role adapter after each step.
    if mode == "per_instance":
        generator = adapter_parameters(trainer.model, "generator")
        for j in range(3):
            shadow = adapter_parameters(trainer.model, f"generator__instance{j}")
            for name, param in generator.items():
                assert torch.equal(param, shadow[name.replace(".generator.", f".generator__instance{j}.")])
        trainer.save_model(str(tmp_path / "saved"))
        assert sorted(p.name for p in (tmp_path / "saved").iterdir() if p.is_dir()) == ["aggregator", "generator"]


def test_per_instance_changes_only_the_parallel_role_update(tiny_model_dir, tmp_path):
    """Three sequential Adam steps on the three instances' gradients differ from one step on their sum."""
    merged = voting_trainer(tiny_model_dir, tmp_path / "m", parallel_role_steps="merged", max_steps=1)
    merged.train()
    per_instance = voting_trainer(tiny_model_dir, tmp_path / "p", parallel_role_steps="per_instance", max_steps=1)
    per_instance.train()
    a, b = adapter_parameters(merged.model, "generator"), adapter_parameters(per_instance.model, "generator")
    assert max((a[n] - b[n]).abs().max().item() for n in a) > 1e-4
    a, b = adapter_parameters(merged.model, "aggregator"), adapter_parameters(per_instance.model, "aggregator")
    assert max((a[n] - b[n]).abs().max().item() for n in a) < 1e-6  # the aggregator's single step is the same


def test_per_instance_refuses_a_shared_adapter(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="also serves \\['aggregator'\\]"):
        voting_trainer(tiny_model_dir, tmp_path, parallel_role_steps="per_instance", policy_sharing="shared")
