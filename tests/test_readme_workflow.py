"""The user workflow printed in README.md trains with the library as it is."""

from __future__ import annotations

import re
from pathlib import Path

from peft import LoraConfig
from scripted import addition_dataset, boxed_answer_reward

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer


def readme_workflow_class():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"<!-- user-workflow -->\s*```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace["DraftCritiqueRewrite"]


def test_readme_workflow_trains(tiny_model_dir, tmp_path):
    workflow = readme_workflow_class()()
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_dir,
        workflow=workflow,
        reward_funcs=boxed_answer_reward,
        args=MultiAgentGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            max_steps=1,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            policy_sharing="isolated",
        ),
        train_dataset=addition_dataset(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and logs[0]["role/drafter/calls"] >= 4 and logs[0]["role/critic/calls"] == 4
    assert list(trainer.model.peft_config) == ["drafter", "critic"]
