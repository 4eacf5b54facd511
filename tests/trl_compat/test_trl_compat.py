"""A TRL GRPO script with the trainer swapped: what a GRPOTrainer user relies on keeps working, or fails at
construction saying why."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import IterableDataset
from peft import get_peft_model
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from tiny import half_right_answers, tiny_config, tiny_lora, tiny_trainer
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer, SingleAgent, Voting
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.training.advantages import outcome_advantages

TWO_STEPS = dict(max_steps=2, logging_steps=1, learning_rate=5e-2, save_strategy="no", seed=0)


def lora_moved(trainer, before: dict) -> set[str]:
    return {n for n, p in trainer.model.named_parameters() if "lora_" in n and not torch.equal(p, before[n])}


def snapshot(trainer) -> dict:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


def test_iterable_train_dataset_trains(tiny_model_dir, tmp_path):
    rows = addition_dataset(8)
    iterable = IterableDataset.from_generator(lambda: iter(rows))
    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, Voting(), dataset=iterable, respond=half_right_answers, **TWO_STEPS
    )
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and lora_moved(trainer, before)


def test_reward_model_with_its_own_tokenizer(tiny_model_dir, tmp_path):
    reward_dir = tmp_path / "reward-model"
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(reward_dir)
    reward_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    reward_tokenizer.save_pretrained(reward_dir)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path / "run",
        SingleAgent(),
        respond=half_right_answers,
        reward_funcs=[str(reward_dir)],
        reward_processing_classes=[reward_tokenizer],
        **TWO_STEPS,
    )
    assert trainer.reward_processing_classes[0] is reward_tokenizer
    before = snapshot(trainer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(math.isfinite(h["rewards/reward-model/mean"]) for h in logs)
    assert lora_moved(trainer, before)


def test_normalize_then_sum_follows_trl():
    rewards_per_func = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 4.0], [1.0, float("nan")]])
    weights = torch.tensor([1.0, 0.5])
    rewards, advantages = outcome_advantages(
        rewards_per_func, weights, num_generations=2, scale_rewards="group", aggregation="normalize_then_sum"
    )
    # per function, per prompt of 2 episodes: (x - mean) / (std + 1e-4); then the weighted sum; then over the batch
    s = math.sqrt(0.5)
    f1 = [0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.0, 0.0]
    f2 = [-1 / (2 * s + 1e-4), 1 / (2 * s + 1e-4), 0.0, 0.0]  # the second prompt's f2 has one value: std NaN -> 0
    expected = torch.tensor([a + 0.5 * b for a, b in zip(f1, f2)])
    assert torch.allclose(rewards, expected, atol=1e-5)
    assert torch.allclose(advantages, (expected - expected.mean()) / (expected.std() + 1e-4), atol=1e-5)


def test_normalize_then_sum_trains(tiny_model_dir, tmp_path):
    def length_reward(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        respond=half_right_answers,
        reward_funcs=[boxed_answer_reward, length_reward],
        multi_objective_aggregation="normalize_then_sum",
        **TWO_STEPS,
    )
    before = snapshot(trainer)
    trainer.train()
    assert lora_moved(trainer, before)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_logged_reward_is_the_weighted_outcome(tiny_model_dir, tmp_path, aggregation):
    """TRL logs ``reward`` as the weighted sum of the functions' outputs whatever the aggregation (the normalised
    sum only drives the advantages): right answers score 1 and 3, wrong ones 0 and 3, weights 0.5 and 0.1."""

    def always_three(completions, **kwargs):
        return [3.0] * len(completions)

    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        respond=half_right_answers,
        reward_funcs=[boxed_answer_reward, always_three],
        reward_weights=[0.5, 0.1],
        multi_objective_aggregation=aggregation,
        **TWO_STEPS,
    )
    trainer.train()
    for log in [h for h in trainer.state.log_history if "loss" in h]:
        solved = log["rewards/boxed_answer_reward/mean"]
        assert 0.0 < solved < 1.0  # both right and wrong answers, so the normalised sums would average 0
        assert log["reward"] == pytest.approx(0.5 * solved + 0.1 * 3.0, abs=1e-6)
        assert log["workflow/success"] == pytest.approx(log["reward"], abs=1e-6)


def peft_model_trainer(peft_model, tiny_model_dir, tmp_path) -> MultiAgentGRPOTrainer:
    """Isolated Voting on a ready PeftModel (no `peft_config`), scripted rollouts."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return MultiAgentGRPOTrainer(
        model=peft_model,
        workflow=Voting(),
        reward_funcs=boxed_answer_reward,
        args=tiny_config(tmp_path, policy_sharing="isolated", **TWO_STEPS),
        train_dataset=addition_dataset(),
        processing_class=tokenizer,
        rollout_backend=ScriptedBackend(tokenizer, half_right_answers),
    )


def test_a_ready_peft_model_default_adapter_starts_every_role(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_lora())
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # a trained adapter, not a fresh one
    start = {n.replace(".default.", "."): p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}
    trainer = peft_model_trainer(peft_model, tiny_model_dir, tmp_path)
    for adapter in ("generator", "aggregator"):
        weights = adapter_parameters(trainer.model, adapter)
        assert all(torch.equal(p, start[n.replace(f".{adapter}.", ".")]) for n, p in weights.items())
    before = snapshot(trainer)
    trainer.train()
    assert {n.split(".lora_")[1].split(".")[1] for n in lora_moved(trainer, before)} == {"generator", "aggregator"}


def test_a_peft_model_with_role_adapters_keeps_them(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_lora(), "generator")
    peft_model.add_adapter("aggregator", tiny_lora())
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    start = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}
    trainer = peft_model_trainer(peft_model, tiny_model_dir, tmp_path)
    assert sorted(trainer.model.peft_config) == ["aggregator", "generator"]
    assert all(torch.equal(p, start[n]) for n, p in trainer.model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(tools=[len]), "cannot be described to the model"),
        (dict(rollout_func=lambda *a: None), "does not take `rollout_func`.*Write the rollout as a Workflow"),
        (dict(reward_funcs=None), "No reward source provided"),
    ],
)
def test_unsupported_or_missing_features_fail_at_construction(tiny_model_dir, tmp_path, overrides, message):
    settings = dict(policy_sharing="isolated", **TWO_STEPS)
    kwargs = {"reward_funcs": boxed_answer_reward, **overrides}
    with pytest.raises((ValueError, TypeError), match=message):
        MultiAgentGRPOTrainer(
            model=tiny_model_dir,
            workflow=Voting(),
            args=tiny_config(tmp_path, **settings),
            train_dataset=addition_dataset(),
            peft_config=tiny_lora(),
            **kwargs,
        )


@pytest.mark.parametrize("workflow", [SingleAgent(), EvalOpt(max_iterations=2)], ids=["single_agent", "eval_opt"])
def test_standard_format_prompts_train(tiny_model_dir, tmp_path, workflow):
    """Plain-text prompts (TRL's standard format): the problem text of every workflow, no chat template for the raw
    single agent; the tiny model generates."""
    dataset = addition_dataset().map(lambda row: {"prompt": row["prompt"][-1]["content"]})
    trainer = tiny_trainer(tiny_model_dir, tmp_path, workflow, dataset=dataset, **TWO_STEPS)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert trainer.state.global_step == 2


def test_raw_single_agent_sends_plain_text_untemplated(tiny_model_dir, tmp_path):
    dataset = addition_dataset().map(lambda row: {"prompt": row["prompt"][-1]["content"]})
    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, SingleAgent(template="raw"), dataset=dataset, respond=half_right_answers, **TWO_STEPS
    )
    trainer.train()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    request = trainer.rollout_backend.requests[-1]
    assert isinstance(request.messages, str) and request.messages.startswith("What is ")
    assert (
        trainer.rollout_backend.tokenizer(text=request.messages)["input_ids"]
        == tokenizer(text=request.messages)["input_ids"]
    )


def test_beam_search_generation_routes_every_beam_to_its_adapter(tiny_model_dir, tmp_path):
    """`generation_kwargs={"num_beams": 2}`: generate runs two rows per prompt; a mixed batch of voter and aggregator
    calls still routes each row to its role's adapter (the tiny model generates)."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        policy_sharing="isolated",
        generation_kwargs={"num_beams": 2},
        rollout_batch_size=None,
        **TWO_STEPS,
    )
    trainer.train()
    assert trainer.state.global_step == 2


def test_reward_functions_log_through_trl_hooks_and_std_is_logged(tiny_model_dir, tmp_path):
    def reporting_reward(completions, log_extra=None, log_metric=None, **kwargs):
        rewards = boxed_answer_reward(completions, **kwargs)
        log_extra("judge_note", [f"note {i}" for i in range(len(completions))])
        log_metric("reporting/mean_reward", sum(rewards) / len(rewards))
        return rewards

    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        respond=half_right_answers,
        reward_funcs=reporting_reward,
        log_completions=True,
        **TWO_STEPS,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:
        assert h["reporting/mean_reward"] == pytest.approx(h["rewards/reporting_reward/mean"])
        assert "rewards/reporting_reward/std" in h
    assert list(trainer._logs["extra"]["judge_note"])[:2] == ["note 0", "note 1"]


def test_all_rewards_none_warns_as_trl(tiny_model_dir, tmp_path, caplog):
    def never_scores(completions, **kwargs):
        return [None] * len(completions)

    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, SingleAgent(), respond=half_right_answers, reward_funcs=never_scores, **TWO_STEPS
    )
    before = snapshot(trainer)
    with caplog.at_level("WARNING", logger="trl.trainer.grpo_trainer"):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(h["reward"] is None and h["workflow/success"] is None for h in logs)
    assert not lora_moved(trainer, before)  # unscorable episodes carry no learning signal
