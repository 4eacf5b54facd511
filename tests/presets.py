"""The shipped presets as the recipes read them.

`recipe_trainer_kwargs` runs a training recipe's own code (its parser, its default preset, its workflow) up to the
trainer and returns what the trainer would get, `evaluation_settings` recipes/evaluate.py's up to the evaluation;
`preset` reads a YAML file of recipes/configs as its settings.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

import trl_multiagent.cli.recipe_run
import trl_multiagent.evaluation
from trl_multiagent.cli.shipped import read_preset
from trl_multiagent.evaluation import EvalSettings
from trl_multiagent.workflows.options import WorkflowOptions

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "recipes" / "configs"
# The paper presets train in bf16, which this CPU machine cannot build a TrainingArguments with: only that is lowered.
ON_CPU = ("--use_cpu", "true", "--bf16", "false")


def preset(name: str) -> dict[str, Any]:
    """The settings of recipes/configs/<name>.yaml (``paper_math``, ``toy``, ...)."""
    return read_preset(str(CONFIGS / f"{name}.yaml"))


def workflow_options(name: str) -> dict[str, str]:
    """The built-in workflows' options a preset sets (all of them), as keyword arguments."""
    settings = preset(name)
    return {option: settings[option] for option in WorkflowOptions.__dataclass_fields__}


class _Called(Exception):
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs


def recipe_call(recipe: str, *argv: str, stop_at: tuple[Any, str]) -> dict[str, Any]:
    """Run ``recipes/<recipe>.py`` launched with ``argv`` until it calls ``stop_at`` (module, name): the keyword
    arguments of that call, which is not made."""

    def capture(**kwargs: Any) -> None:
        raise _Called(kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(*stop_at, capture)
        patch.setattr(sys, "argv", [f"recipes/{recipe}.py", *argv])
        try:
            runpy.run_path(str(ROOT / "recipes" / f"{recipe}.py"), run_name="__main__")
        except _Called as called:
            return called.kwargs
    raise AssertionError(f"recipes/{recipe}.py finished without calling {stop_at[1]}.")


def recipe_trainer_kwargs(recipe: str, *argv: str) -> dict[str, Any]:
    """What a training recipe gives `MultiAgentGRPOTrainer` (``args``, ``workflow``, ``peft_config``, ...)."""
    return recipe_call(recipe, *argv, stop_at=(trl_multiagent.cli.recipe_run, "MultiAgentGRPOTrainer"))


def evaluation_settings(*argv: str) -> EvalSettings:
    """The `EvalSettings` recipes/evaluate.py evaluates with under ``argv``."""
    return recipe_call("evaluate", *argv, stop_at=(trl_multiagent.evaluation, "evaluate"))["settings"]


def recipe_args(*argv: str, recipe: str = "eval_opt_math"):
    """The `MultiAgentGRPOConfig` a recipe trains with under ``argv``, on its task's offline dataset."""
    offline = ("--dataset_name", "arithmetic" if recipe.endswith("math") else "toy_code")
    return recipe_trainer_kwargs(recipe, *argv, *offline)["args"]
