"""Each recipe runs as a subprocess at minimum size, the way a user launches it."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from harness import ROOT, TESTS, run_offline

DAPO_FIXTURE = TESTS / "fixtures" / "dapo_math_17k_sample.jsonl"
pytestmark = pytest.mark.slow  # each test runs a recipe in a subprocess


def run(command: list[str], tmp_path) -> None:
    run_offline(command, cwd=ROOT)


def small_run(recipe: str, tiny_model_dir, output_dir, *extra) -> list[str]:
    return [
        f"recipes/{recipe}.py",
        "--config",
        "recipes/configs/cpu.yaml",
        "--model_name_or_path",
        tiny_model_dir,
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--max_completion_length",
        "8",
        *extra,
    ]


@pytest.mark.parametrize("recipe", ["voting_math", "orch_workers_math", "single_agent_math"])
def test_recipe_runs_on_cpu(recipe, tiny_model_dir, tmp_path):
    run([sys.executable, *small_run(recipe, tiny_model_dir, tmp_path)], tmp_path)
    assert (tmp_path / "checkpoint-2" / "multiagent_config.json").is_file()
    saved = json.loads((tmp_path / "multiagent_config.json").read_text())["workflow"]  # the final save
    assert saved["prompts"] == "paper"  # the paper preset by default
    assert saved.get("workers", "per_strategy") == "per_strategy" and saved.get("template", "generator") == "generator"


def test_eval_opt_recipe_through_accelerate_launch(tiny_model_dir, tmp_path):
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
    command = [accelerate, "launch", "--config_file", "accelerate_configs/cpu.yaml"]
    run([*command, *small_run("eval_opt_math", tiny_model_dir, tmp_path, "--policy_sharing", "isolated")], tmp_path)
    for role in ("generator", "evaluator"):
        assert (tmp_path / "checkpoint-2" / role / "adapter_model.safetensors").is_file()


def test_recipe_reads_dapo_math_file(tiny_model_dir, tmp_path):
    extra = ["--dataset_name", str(DAPO_FIXTURE), "--max_steps", "1", "--save_steps", "1"]
    run([sys.executable, *small_run("single_agent_math", tiny_model_dir, tmp_path, *extra)], tmp_path)
    assert (tmp_path / "checkpoint-1").is_dir()
