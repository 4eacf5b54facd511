"""Each code recipe runs as a subprocess at minimum size, the way a user launches it, grading in the sandbox."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import ROOT, TESTS, needs_sandbox, run_offline

DEEPCODER_FIXTURE = TESTS / "fixtures" / "deepcoder_sample.jsonl"

pytestmark = [needs_sandbox, pytest.mark.slow]  # each test runs a recipe in a subprocess


def run(recipe: str, tiny_model_dir: str, output_dir: Path, *extra: str) -> str:
    command = [
        sys.executable,
        f"recipes/{recipe}.py",
        "--config",
        "recipes/configs/cpu_code.yaml",
        "--model_name_or_path",
        tiny_model_dir,
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "1",
        "--save_steps",
        "1",
        "--max_completion_length",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        *extra,
    ]
    result = run_offline(command, cwd=ROOT)
    return result.stdout + result.stderr


def logged(output_dir: Path) -> set[str]:
    """Every metric the run logged (the console shows a compact line; the full log is in the trainer state)."""
    state = json.loads((output_dir / "checkpoint-1" / "trainer_state.json").read_text())
    return {key for entry in state["log_history"] for key in entry}


def saved_workflow(output_dir: Path) -> dict:
    assert (output_dir / "checkpoint-1" / "multiagent_config.json").is_file()
    return json.loads((output_dir / "multiagent_config.json").read_text())["workflow"]  # the final save


@pytest.mark.parametrize(
    ("recipe", "workflow"),
    [
        (
            "voting_code",
            {
                "workflow": "Voting",
                "import_path": "trl_multiagent.workflows.voting:Voting",
                "n_voters": 3,
                "task": "code",
                "parsing": "reference",
                "prompts": "paper",
            },
        ),
        (
            "orch_workers_code",
            {
                "workflow": "OrchWorkers",
                "import_path": "trl_multiagent.workflows.orch_workers:OrchWorkers",
                "n_workers": 3,
                "task": "code",
                "workers": "per_strategy",
                "parsing": "reference",
                "prompts": "paper",
            },
        ),
        (
            "single_agent_code",
            {
                "workflow": "SingleAgent",
                "import_path": "trl_multiagent.workflows.single_agent:SingleAgent",
                "task": "code",
                "template": "generator",
                "prompts": "paper",
            },
        ),
    ],
)
def test_code_recipe_runs_on_toy_problems(recipe, workflow, tiny_model_dir, tmp_path):
    run(recipe, tiny_model_dir, tmp_path)
    assert saved_workflow(tmp_path) == workflow
    assert "rewards/code_reward/mean" in logged(tmp_path)  # all_pass, the paper's reward, by default


def test_eval_opt_code_recipe_reads_a_deepcoder_file(tiny_model_dir, tmp_path):
    extra = ["--dataset_name", str(DEEPCODER_FIXTURE), "--code_reward_mode", "fraction"]
    run("eval_opt_code", tiny_model_dir, tmp_path, *extra)
    assert saved_workflow(tmp_path) == {
        "workflow": "EvalOpt",
        "import_path": "trl_multiagent.workflows.eval_opt:EvalOpt",
        "max_iterations": 2,
        "task": "code",
        "history": "shared",
        "parsing": "reference",
        "prompts": "paper",
    }
    assert "rewards/code_reward_fraction/mean" in logged(tmp_path)
    for role in ("generator", "evaluator"):  # cpu_code.yaml trains one adapter per role
        assert (tmp_path / role / "adapter_model.safetensors").is_file()
