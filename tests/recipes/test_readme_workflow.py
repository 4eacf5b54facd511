"""The user workflow printed in README.md trains with the library as it is."""

from __future__ import annotations

import re
from pathlib import Path

from tiny import tiny_trainer


def readme_workflow_class():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = re.search(r"<!-- user-workflow -->\s*```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace["DraftCritiqueRewrite"]


def test_readme_workflow_trains(tiny_model_dir, tmp_path):
    workflow = readme_workflow_class()()
    settings = dict(max_steps=1, logging_steps=1, save_strategy="no", policy_sharing="isolated")
    trainer = tiny_trainer(tiny_model_dir, tmp_path, workflow, **settings)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and logs[0]["role/drafter/calls"] >= 4 and logs[0]["role/critic/calls"] == 4
    assert list(trainer.model.peft_config) == ["drafter", "critic"]
