"""Bad input fails at construction with a message that says how to fix it."""

from __future__ import annotations

import pytest
from datasets import Dataset
from scripted import addition_dataset, boxed_answer_reward
from tiny import tiny_config, tiny_trainer

from trl_multiagent import MultiAgentGRPOTrainer, SingleAgent
from trl_multiagent.workflows import Workflow


def test_unknown_role_in_mapping(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"names role\(s\) \['judge'\].*roles are \['generator', 'aggregator'\]"):
        tiny_trainer(tiny_model_dir, tmp_path, role_to_adapter={"generator": "g", "aggregator": "a", "judge": "a"})


def test_unknown_role_in_loss_weights(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"`role_loss_weights` names role\(s\) \['voter'\]"):
        tiny_trainer(tiny_model_dir, tmp_path, role_loss_weights={"voter": 2.0})


def test_missing_prompt_column(tiny_model_dir, tmp_path):
    dataset = Dataset.from_list([{"question": "1+1", "answer": "2"}] * 4)
    with pytest.raises(ValueError, match="has no `prompt` column.*conversational `prompt`"):
        tiny_trainer(tiny_model_dir, tmp_path, dataset=dataset)


def test_fewer_than_two_generations(tmp_path):
    with pytest.raises(ValueError, match="at least 2 generations"):
        tiny_config(tmp_path, num_generations=1)


class CallsAnUndeclaredRole(Workflow):
    roles = ("generator",)

    async def run(self, prompt, generate):
        draft = await generate("generator", prompt)
        return await generate("critic", [{"role": "user", "content": draft}])


def test_workflow_calling_undeclared_role_fails_at_construction(tiny_model_dir, tmp_path):
    with pytest.raises(RuntimeError, match=r"generate\(role='critic'\).*Add 'critic' to the workflow's `roles`"):
        tiny_trainer(tiny_model_dir, tmp_path, CallsAnUndeclaredRole())


def test_peft_config_is_required(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="LoRA `peft_config`"):
        MultiAgentGRPOTrainer(
            model=tiny_model_dir,
            workflow=SingleAgent(),
            reward_funcs=boxed_answer_reward,
            args=tiny_config(tmp_path),
            train_dataset=addition_dataset(),
        )


def test_bad_config_values(tmp_path):
    with pytest.raises(ValueError, match="`policy_sharing` must be 'shared' or 'isolated'"):
        tiny_config(tmp_path, policy_sharing="separate")
    with pytest.raises(ValueError, match=r"`role_loss_weights\['generator'\]` must be a number >= 0"):
        tiny_config(tmp_path, role_loss_weights={"generator": -1})
    parsed = tiny_config(tmp_path, role_beta='{"evaluator": 0.1}')  # JSON from the command line
    assert parsed.role_beta == {"evaluator": 0.1}
