"""A training recipe launched bare (the paper preset, bf16) on a machine without a bf16 accelerator stops in the
recipe, before transformers' "Your setup doesn't support bf16/gpu", and names the CPU preset to run instead."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from harness import offline_env

import trl_multiagent.cli.shipped
from trl_multiagent.cli.shipped import bf16_device_available, recipe_argv

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "recipes" / "configs"
TRAINING_RECIPES = sorted(
    path.stem
    for path in (ROOT / "recipes").glob("*.py")
    if path.stem.endswith(("_math", "_code")) or path.stem == "train"
)


def cpu_preset_of(recipe: str) -> str:
    return "recipes/configs/toy_code.yaml" if recipe.endswith("_code") else "recipes/configs/toy.yaml"


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_bare_recipe_without_accelerator_names_the_cpu_preset(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(trl_multiagent.cli.shipped, "bf16_device_available", lambda: False)
    monkeypatch.setattr(sys, "argv", [f"recipes/{recipe}.py", "--output_dir", "unused"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "recipes" / f"{recipe}.py"), run_name="__main__")
    message = str(stop.value.code)
    assert "need a GPU" in message
    assert (
        f"accelerate launch --config_file accelerate_configs/cpu.yaml recipes/{recipe}.py "
        f"--config {cpu_preset_of(recipe)}" in message
    )
    assert (ROOT / cpu_preset_of(recipe)).is_file()


def test_paper_preset_is_added_where_it_can_run(monkeypatch):
    paper, toy = CONFIGS / "paper_math.yaml", CONFIGS / "toy.yaml"
    monkeypatch.setattr(trl_multiagent.cli.shipped, "bf16_device_available", lambda: True)
    argv = ["recipes/eval_opt_math.py", "--output_dir", "out"]
    assert recipe_argv(argv, paper_preset=paper, cpu_preset=toy) == ["--config", str(paper), "--output_dir", "out"]


@pytest.mark.parametrize(
    "args", [["--config", "recipes/configs/toy.yaml"], ["--bf16", "false"], ["--use_cpu", "true", "--bf16", "false"]]
)
def test_a_chosen_config_or_precision_is_not_second_guessed(args, monkeypatch):
    paper, toy = CONFIGS / "paper_math.yaml", CONFIGS / "toy.yaml"
    monkeypatch.setattr(trl_multiagent.cli.shipped, "bf16_device_available", lambda: False)
    expected = args if "--config" in args else ["--config", str(paper), *args]
    assert recipe_argv(["recipes/eval_opt_math.py", *args], paper_preset=paper, cpu_preset=toy) == expected


@pytest.mark.slow
@pytest.mark.skipif(bf16_device_available(), reason="this machine trains in bf16: the paper preset runs here")
def test_bare_launch_on_cpu_stops_before_transformers():
    result = subprocess.run(
        [sys.executable, "recipes/eval_opt_math.py"],
        cwd=ROOT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "doesn't support bf16" not in result.stderr
    assert "--config recipes/configs/toy.yaml" in result.stderr, result.stderr[-2000:]
