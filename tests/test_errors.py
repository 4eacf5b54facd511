"""Bad input fails at construction with a message that says how to fix it."""

from __future__ import annotations

import pytest
from datasets import Dataset
from peft import LoraConfig
from scripted import addition_dataset, boxed_answer_reward

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, SingleAgent, Voting
from trl_multiagent.workflows import Workflow

LORA = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")


def config(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        report_to="none",
    )
    return MultiAgentGRPOConfig(**{**settings, **overrides})


def build(tiny_model_dir, tmp_path, workflow=None, dataset=None, **overrides):
    return MultiAgentGRPOTrainer(
        model=tiny_model_dir,
        workflow=workflow or Voting(),
        reward_funcs=boxed_answer_reward,
        args=config(tmp_path, **overrides),
        train_dataset=dataset if dataset is not None else addition_dataset(),
        peft_config=LORA,
    )


def test_unknown_role_in_mapping(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"names role\(s\) \['judge'\].*roles are \['generator', 'aggregator'\]"):
        build(tiny_model_dir, tmp_path, role_to_adapter={"generator": "g", "aggregator": "a", "judge": "a"})


def test_unknown_role_in_loss_weights(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"`role_loss_weights` names role\(s\) \['voter'\]"):
        build(tiny_model_dir, tmp_path, role_loss_weights={"voter": 2.0})


def test_missing_prompt_column(tiny_model_dir, tmp_path):
    dataset = Dataset.from_list([{"question": "1+1", "answer": "2"}] * 4)
    with pytest.raises(ValueError, match="has no `prompt` column.*conversational `prompt`"):
        build(tiny_model_dir, tmp_path, dataset=dataset)


def test_fewer_than_two_generations(tmp_path):
    with pytest.raises(ValueError, match="at least 2 generations"):
        config(tmp_path, num_generations=1)


class CallsAnUndeclaredRole(Workflow):
    roles = ("generator",)

    async def run(self, prompt, generate):
        draft = await generate("generator", prompt)
        return await generate("critic", [{"role": "user", "content": draft}])


def test_workflow_calling_undeclared_role_fails_at_construction(tiny_model_dir, tmp_path):
    with pytest.raises(RuntimeError, match=r"generate\(role='critic'\).*Add 'critic' to the workflow's `roles`"):
        build(tiny_model_dir, tmp_path, workflow=CallsAnUndeclaredRole())


def test_peft_config_is_required(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="LoRA `peft_config`"):
        MultiAgentGRPOTrainer(
            model=tiny_model_dir,
            workflow=SingleAgent(),
            reward_funcs=boxed_answer_reward,
            args=config(tmp_path),
            train_dataset=addition_dataset(),
        )


def test_bad_config_values(tmp_path):
    with pytest.raises(ValueError, match="`policy_sharing` must be 'shared' or 'isolated'"):
        config(tmp_path, policy_sharing="separate")
    with pytest.raises(ValueError, match=r"`role_loss_weights\['generator'\]` must be a number >= 0"):
        config(tmp_path, role_loss_weights={"generator": -1})
    parsed = config(tmp_path, role_beta='{"evaluator": 0.1}')  # JSON from the command line
    assert parsed.role_beta == {"evaluator": 0.1}
