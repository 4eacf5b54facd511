"""Role loss balance and per-role KL anchors act on the roles they name, and only on them."""

from __future__ import annotations

import torch
from peft import LoraConfig
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from transformers import AutoTokenizer

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting
from trl_multiagent.loss_weights import role_weights
from trl_multiagent.routing import adapter_parameters


def test_per_role_balance_gives_each_role_type_an_equal_share():
    roles = ["generator", "generator", "generator", "aggregator"] * 5  # 5 Voting episodes
    tokens = torch.tensor([30.0, 10.0, 20.0, 5.0] * 5)
    for loss_type in ("grpo", "dapo"):  # sequence-level and token-level aggregation
        weights = role_weights(roles, tokens, {}, "per_role", loss_type)
        size = tokens if loss_type == "dapo" else torch.ones_like(tokens)
        share = {r: float(sum(weights[i] * size[i] for i, x in enumerate(roles) if x == r)) for r in set(roles)}
        assert abs(share["generator"] - share["aggregator"]) < 1e-4
        assert abs(sum(share.values()) - float(size.sum())) < 1e-3  # the total loss scale is unchanged
    per_output = role_weights(roles, tokens, {"aggregator": 0.5}, "per_output", "grpo")
    assert per_output.tolist() == [1.0, 1.0, 1.0, 0.5] * 5


def voting_run(tiny_model_dir, tmp_path, **overrides):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = ScriptedBackend(tokenizer, lambda requests, rng: [f"\\boxed{{{rng.randint(2, 5)}}}" for _ in requests])
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_dir,
        workflow=Voting(),
        reward_funcs=boxed_answer_reward,
        args=MultiAgentGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            max_steps=3,
            logging_steps=1,
            learning_rate=5e-2,
            report_to="none",
            save_strategy="no",
            policy_sharing="isolated",
            seed=0,
            **overrides,
        ),
        train_dataset=addition_dataset(4),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
        processing_class=tokenizer,
        rollout_backend=backend,
    )
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
