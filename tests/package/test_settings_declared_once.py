"""A setting declared in more than one place (a config field, an evaluation setting, a workflow option, a recipe's or
the grid's argument, a workflow constructor's parameter) is declared alike everywhere: the same default, choices and
type, unless it is listed below as differing on purpose, with why."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import types
import typing
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from trl import ModelConfig, ScriptArguments

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.evaluation import EvalSettings
from trl_multiagent.workflows.options import BUILT_IN, WorkflowOptions

ROOT = Path(__file__).resolve().parents[2]
# (setting, aspect) -> why its declarations differ
ON_PURPOSE = {
    ("temperature", "default"): "evaluation is greedy unless asked (EvalSettings); training samples (TRL's 1.0)",
    ("max_completion_length", "default"): "EvalSettings' None is the task's evaluation length, chosen by --task",
    ("dtype", "default"): "EvalSettings' None loads a checkpoint in the dtype it was saved in",
    ("dtype", "choices"): "EvalSettings passes any torch dtype name to from_pretrained",
    ("max_iterations", "default"): "Eval-Opt's attempts: the paper's 3 for math (the constructor's), 2 for code",
    ("max_steps", "default"): "the grid's every run trains the paper's 500 steps; a training alone, TRL's -1",
    ("save_steps", "default"): "the grid checkpoints (and evaluates) every 5 steps, as the paper; TRL's 500",
    ("save_steps", "type"): "the grid passes whole steps; TRL's also takes a fraction of the run",
    ("policy_sharing", "default"): "the grid trains both sharings; a training one",
    ("policy_sharing", "type"): "the grid takes a list of sharings, a training one",
    ("workflow", "default"): "evaluate.py's runs instead of the run's own (None: the run's); train.py's is trained",
    ("workflow", "type"): "evaluate.py's may be left out (the run's own workflow); train.py trains one",
}


def recipe_module(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the recipes run under `if __name__ == "__main__"` only
    return module


def parser_dataclasses() -> list[type]:
    """Every dataclass a recipe's parser (or the grid's) reads."""
    found = [MultiAgentGRPOConfig, ScriptArguments, ModelConfig, EvalSettings, WorkflowOptions]
    for path in sorted((ROOT / "recipes").glob("*.py")):
        module = recipe_module(path)
        found += [
            value
            for name, value in vars(module).items()
            if dataclasses.is_dataclass(value) and name.endswith("Arguments") and value.__module__ == module.__name__
        ]
    return found


def members(annotation: Any) -> frozenset:
    """The types a value may have under ``annotation`` (the members of a union)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return frozenset(typing.get_args(annotation) if union else (annotation,))


def declarations() -> dict[str, list[dict[str, Any]]]:
    """Setting name -> each declaration: where, default, choices, types (and whether it is a constructor's)."""
    found = defaultdict(list)
    for cls in parser_dataclasses():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            missing = field.default is dataclasses.MISSING
            default = field.default_factory() if missing else field.default
            where, choices = f"{cls.__module__}.{cls.__name__}", field.metadata.get("choices")
            found[field.name].append(
                dict(where=where, default=default, choices=choices, type=members(hints[field.name]))
            )
    for cls in BUILT_IN:
        hints = typing.get_type_hints(cls if dataclasses.is_dataclass(cls) else cls.__init__)
        for name, parameter in inspect.signature(cls).parameters.items():
            where = f"{cls.__name__}({name}=...)"
            found[name].append(
                dict(where=where, default=parameter.default, type=members(hints[name]), constructor=True)
            )
    return found


def disagreements(name: str, declared: list[dict[str, Any]]) -> dict[str, list]:
    """Aspect -> (where, value) of each declaration, for the aspects on which ``name``'s declarations differ."""
    fields = [d for d in declared if not d.get("constructor")]
    found = {}
    for aspect in ("default", "choices", "type"):
        among = fields if aspect != "default" else declared  # a constructor declares no choices; its type below
        values = [(d["where"], d[aspect]) for d in among]
        if len({repr(value) for _, value in values}) > 1:
            found[aspect] = values
    # A parser's field offers the command line a part of what a constructor takes (a prompt set's name, not a
    # PromptSet): every type the field has, the constructor takes.
    for constructor in (d for d in declared if d.get("constructor")):
        refused = [(d["where"], d["type"]) for d in fields if not d["type"] <= constructor["type"]]
        if refused:
            found.setdefault("type", []).extend([(constructor["where"], constructor["type"]), *refused])
    return found


def test_each_setting_is_declared_alike_wherever_it_is_declared():
    unexpected, stale = [], set(ON_PURPOSE)
    for name, declared in declarations().items():
        for aspect, values in disagreements(name, declared).items():
            stale.discard((name, aspect))
            if (name, aspect) not in ON_PURPOSE:
                unexpected.append(f"{name}: {aspect} differs: {values}")
    assert unexpected == [], "\n".join(unexpected)
    assert stale == set(), f"listed as differing on purpose, but declared alike: {sorted(stale)}"


def test_a_setting_declared_twice_with_other_choices_is_found():
    """The check above fails when two declarations drift apart (here EvalSettings' chat_rendering, as it stood once
    with its own choices)."""
    declared = declarations()["chat_rendering"]
    drifted = [*declared, {**declared[-1], "where": "EvalSettings (own copy)", "choices": ["tokenizer"]}]
    assert "choices" in disagreements("chat_rendering", drifted)


@pytest.mark.parametrize(
    "name, owner", [("chat_rendering", MultiAgentGRPOConfig), ("tool_timeout", MultiAgentGRPOConfig)]
)
def test_the_evaluation_takes_its_settings_from_the_training_config(name, owner):
    ours = EvalSettings.__dataclass_fields__[name]
    assert (ours.default, ours.metadata) == (
        owner.__dataclass_fields__[name].default,
        owner.__dataclass_fields__[name].metadata,
    )


def test_the_workflow_options_take_their_defaults_from_the_constructors():
    for option in dataclasses.fields(WorkflowOptions):
        takers = [cls for cls in BUILT_IN if option.name in inspect.signature(cls).parameters]
        assert takers and option.metadata["help"].endswith(f"Taken by {', '.join(c.__name__ for c in takers)}.")
        assert {inspect.signature(cls).parameters[option.name].default for cls in takers} == {option.default}
