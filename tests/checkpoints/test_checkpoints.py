"""Checkpoints hold every role adapter in its own folder and resume to the same training trajectory."""

from __future__ import annotations

import json

import torch
from peft import PeftModel
from tiny import tiny_trainer
from transformers import AutoModelForCausalLM


def make(tiny_model_dir, output_dir, max_steps=3):
    settings = dict(save_steps=1, logging_steps=1, learning_rate=5e-2, policy_sharing="isolated", seed=3)
    return tiny_trainer(tiny_model_dir, output_dir, max_steps=max_steps, **settings)


def adapters(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_checkpoint_layout_and_exact_resume(tiny_model_dir, tmp_path):
    full = make(tiny_model_dir, tmp_path / "full")
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-2"
    for role in ("generator", "aggregator"):
        assert (checkpoint / role / "adapter_model.safetensors").is_file()
    saved = json.loads((checkpoint / "multiagent_config.json").read_text())
    assert saved["workflow"] == {
        "workflow": "Voting",
        "import_path": "trl_multiagent.workflows.voting:Voting",
        "n_voters": 3,
        "task": "math",
        "parsing": "reference",
        "prompts": "paper",
    }
    assert saved["role_to_adapter"] == {"generator": "generator", "aggregator": "aggregator"}

    # Each folder loads with plain PEFT under its role's name.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loaded = PeftModel.from_pretrained(base, str(checkpoint / "generator"), adapter_name="generator")
    assert "generator" in loaded.peft_config

    resumed = make(tiny_model_dir, tmp_path / "full")  # same output_dir: resume from its checkpoint-2
    resumed.train(resume_from_checkpoint=str(checkpoint))
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h]  # noqa: E731
    assert losses(resumed)[-1] == losses(full)[-1]
    expected, actual = adapters(full.model), adapters(resumed.model)
    assert max((expected[n] - actual[n]).abs().max().item() for n in expected) < 1e-6
    assert any(
        not torch.equal(expected[n], adapters(make(tiny_model_dir, tmp_path / "x", 1).model)[n]) for n in expected
    )
