"""A mixture-of-experts model: LoRA on expert and router weights sees flattened tokens and cannot mix adapters in a
batch, so mixed batches are split by adapter (each sample still through its own adapter) and every role trains."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import random_answers, tiny_trainer

from trl_multiagent import Voting
from trl_multiagent.adapters.routing import adapter_parameters


@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_isolated_voting_trains_every_role_adapter_on_a_moe_model(tiny_moe_dir, tmp_path, schedule):
    trainer = tiny_trainer(
        tiny_moe_dir,
        tmp_path,
        Voting(),
        respond=random_answers,
        policy_sharing="isolated",
        max_steps=2,
        logging_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        seed=0,
        update_schedule=schedule,
    )
    assert not trainer._updates.installed.router.mixes_adapters  # LoRA on expert/router weights (PEFT's ParamWrapper)
    experts = [n for n in adapter_parameters(trainer.model, "generator") if "experts" in n]
    assert experts  # the experts carry LoRA weights of every adapter
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    for adapter in ("generator", "aggregator"):
        moved = [n for n, p in adapter_parameters(trainer.model, adapter).items() if not torch.equal(p, before[n])]
        assert any("experts" in n for n in moved) and any("self_attn" in n for n in moved), adapter


def test_moe_model_generates_mixed_adapter_batches_by_adapter(tiny_moe_dir, tmp_path):
    """Generation on the MoE model itself: a tick holding voter and aggregator calls runs one batch per adapter."""
    trainer = tiny_trainer(
        tiny_moe_dir,
        tmp_path,
        Voting(),
        policy_sharing="isolated",
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
    )
    episodes = trainer.engine.run([[{"role": "user", "content": "What is 1 + 2?"}]] * 2)
    assert [len(e.calls) for e in episodes] == [4, 4]
    assert {c.adapter for e in episodes for c in e.calls} == {"generator", "aggregator"}
