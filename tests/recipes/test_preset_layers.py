"""Presets that build on one another: `base:` names the preset a file starts from, and the recipes' parser reads the
chain. The shipped presets hold only their differences and read to the settings their flat files gave before they
layered (tests/fixtures/flat_presets.json: every file of recipes/configs at commit 7b408dd, as yaml.safe_load reads
it), but for cpu.yaml's mini-batch, which tripped the config's own warning; no shipped preset trips one of ours."""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from pathlib import Path

import pytest
import yaml
from presets import ON_CPU, recipe_call
from trl import ModelConfig, ScriptArguments

import trl_multiagent.cli.recipe_run
import trl_multiagent.evaluation
from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.cli.recipe_parser import RecipeParser
from trl_multiagent.cli.shipped import preset_layers, read_preset
from trl_multiagent.config.multiagent_grpo_config import SettingsWarning
from trl_multiagent.evaluation import EvalSettings
from trl_multiagent.workflows.options import BUILT_IN, WorkflowOptions

FLAT = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "flat_presets.json").read_text())
# The training recipes' parser, less the arguments of their own workflow; recipes/evaluate.py's settings.
TRAINING = (ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions)
EVALUATION = (EvalSettings,)
# What layering changed on purpose, (before, after): cpu.yaml set the paper's 64 prompts per mini-batch on its
# 2-prompt batch; now one generation batch, the reference's ratio (the config's default, None).
# And paper_math.yaml gained `activation_memory_gb: 48` (recompute only where an 80 GB card's activations would not
# fit), which every preset built on it inherits.
CHANGED = {name: {"activation_memory_gb": (None, 48)} for name in FLAT if name != "paper_eval"}
for name in ("cpu", "cpu_code"):
    CHANGED[name]["mini_batch_prompts"] = (64, None)


def parser_of(name: str) -> RecipeParser:
    return RecipeParser(EVALUATION if name == "paper_eval" else TRAINING)


def parsed(name: str, config: str | Path, *argv: str) -> tuple:
    """The dataclasses the recipe's parser builds from ``config`` (the paper presets' bf16 lowered to fp32 on this CPU
    machine, alike for both sides)."""
    lowered = ON_CPU if FLAT[name].get("bf16") else ()
    return parser_of(name).parse_args_and_config(["--config", str(config), *lowered, *argv])


def settings(name: str, config: str | Path, *argv: str) -> dict:
    """Every field of every dataclass the recipe's parser builds from ``config``."""
    outputs = parsed(name, config, *argv)
    return {field.name: getattr(output, field.name) for output in outputs for field in dataclasses.fields(output)}


def flat_file(name: str, folder: Path) -> Path:
    path = folder / f"{name}-flat.yaml"
    path.write_text(yaml.safe_dump(FLAT[name], sort_keys=False))
    return path


@pytest.mark.filterwarnings(
    "ignore::trl_multiagent.config.multiagent_grpo_config.SettingsWarning"
)  # the flat cpu.yaml's, tested below
@pytest.mark.parametrize("name", sorted(FLAT))
def test_every_shipped_preset_reads_as_its_flat_file_did(name, tmp_path):
    before = settings(name, flat_file(name, tmp_path))
    after = settings(name, name)
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    assert changed == CHANGED.get(name, {})
    merged = read_preset(name)  # also what the parse lowered above (bf16)
    assert {key: merged[key] for key in FLAT[name] if key not in changed} == {
        key: value for key, value in FLAT[name].items() if key not in changed
    }


@pytest.mark.parametrize("name", sorted(FLAT))
def test_a_shipped_preset_sets_only_what_differs_from_its_base(name):
    *bases, own = preset_layers(name)
    inherited = read_preset(str(bases[-1].path)) if bases else {}
    repeated = sorted(key for key, value in own.settings.items() if key in inherited and inherited[key] == value)
    assert repeated == [], f"{own.path.name} repeats what {bases[-1].path.name} sets: {repeated}"


EXPECTED_BASES = {
    "paper_math": [],
    "paper_code": ["paper_math"],
    "paper_eval": [],
    "toy": ["paper_math"],
    "toy_code": ["paper_math", "toy"],
    "toy_two_models": ["paper_math", "toy"],
    "cpu": ["paper_math"],
    "cpu_code": ["paper_math", "cpu"],
}


def test_the_toy_and_cpu_presets_build_on_the_paper_preset():
    assert {name: [layer.path.stem for layer in preset_layers(name)[:-1]] for name in FLAT} == EXPECTED_BASES


@pytest.mark.parametrize("name", sorted(FLAT))
def test_no_shipped_preset_trips_a_warning_of_ours(name, caplog):
    """Ours are `SettingsWarning`s and the warnings our loggers write; upstream's (transformers' deprecations) are
    not ours to fix here."""
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="trl_multiagent"):
        warnings.simplefilter("error", SettingsWarning)
        outputs = parsed(name, name)
        for args in (output for output in outputs if isinstance(output, MultiAgentGRPOConfig)):
            for workflow_class in BUILT_IN:  # what the trainer asks of the config for each built-in workflow
                args.prompt_limit_for(workflow_class)
    assert [record.getMessage() for record in caplog.records if record.name.startswith("trl_multiagent")] == []


def test_the_flat_cpu_preset_tripped_the_mini_batch_warning(tmp_path):
    with pytest.warns(SettingsWarning, match="mini_batch_prompts=64 is more than the 2 prompts"):
        settings("cpu", flat_file("cpu", tmp_path))


def test_a_user_preset_builds_on_a_shipped_one_or_on_a_file_beside_it(tmp_path, monkeypatch):
    """A key a file sets replaces its base's value whole (a mapping too); a relative `base:` is read beside the file
    that names it, wherever the recipe runs."""
    folder = tmp_path / "mine"
    folder.mkdir()
    short = "base: toy\nmax_steps: 3\nchat_template_kwargs:\n  add_generation_prompt: true\n"
    (folder / "short.yaml").write_text(short)
    (folder / "shorter.yaml").write_text("base: short.yaml\nsave_steps: 1\n")
    monkeypatch.chdir(tmp_path)
    mine = settings("toy", folder / "shorter.yaml")
    toy = settings("toy", "toy", "--max_steps", "3", "--save_steps", "1")
    assert mine["chat_template_kwargs"] == {"add_generation_prompt": True}  # not merged with toy's enable_thinking
    assert {key: value for key, value in mine.items() if key != "chat_template_kwargs"} == {
        key: value for key, value in toy.items() if key != "chat_template_kwargs"
    }
    assert [layer.path.name for layer in preset_layers(str(folder / "shorter.yaml"))] == [
        "paper_math.yaml",
        "toy.yaml",
        "short.yaml",
        "shorter.yaml",
    ]


def test_a_loop_of_bases_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nmax_steps: 1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nmax_steps: 2\n")
    with pytest.raises(ValueError, match=r"in a loop: .*a\.yaml -> .*b\.yaml -> .*a\.yaml. Remove `base:`"):
        preset_layers(str(tmp_path / "a.yaml"))


def test_a_base_that_is_nowhere_names_the_file_and_the_shipped_presets(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: paper_mth\n")
    with pytest.raises(FileNotFoundError, match=r"mine\.yaml: `base: paper_mth`: .*shipped: \['cpu', "):
        read_preset(str(tmp_path / "mine.yaml"))
    (tmp_path / "two.yaml").write_text("base: [toy, cpu]\n")
    with pytest.raises(ValueError, match="takes one preset"):
        read_preset(str(tmp_path / "two.yaml"))


def test_one_line_says_which_layers_made_the_settings(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text("max_steps: 3\noutput_dir: out\nuse_cpu: true\nbf16: false\n")
    cases = [
        (["--config", "toy"], "library defaults + paper_math.yaml + toy.yaml"),
        (["--config", "toy", "--max_steps", "3"], "library defaults + paper_math.yaml + toy.yaml + command line"),
        (["--config", str(tmp_path / "mine.yaml")], "library defaults + mine.yaml"),
        (["--output_dir", "out", *ON_CPU], "library defaults + command line"),
    ]
    for argv, layers in cases:
        RecipeParser(TRAINING).parse_args_and_config(argv)
        assert capsys.readouterr().err.splitlines()[-1] == f"settings: {layers}", argv


def test_print_config_prints_each_setting_with_its_layer_and_trains_nothing(capsys):
    argv = ("--config", "toy", "--max_steps", "3", "--print-config")
    with pytest.raises(SystemExit) as stop:
        recipe_call("eval_opt_math", *argv, stop_at=(trl_multiagent.cli.recipe_run, "MultiAgentGRPOTrainer"))
    assert stop.value.code == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "# settings: library defaults + paper_math.yaml + toy.yaml + command line"
    for line in (
        "max_steps: 3  # command line",
        "learning_rate: 0.001  # toy.yaml",
        "temperature: 0.7  # paper_math.yaml",
        "lora_alpha: 32  # paper_math.yaml",
        "num_iterations: 1  # library default",
        'prompts: "guarded"  # toy.yaml',
        "max_iterations: 3  # library default",  # the recipe's own WorkflowArguments
    ):
        assert line in printed


def test_print_config_shows_what_the_config_derived(capsys):
    """The paper preset sizes a step by prompts_per_step: the per-process batch is derived from it."""
    with pytest.raises(SystemExit):
        RecipeParser(TRAINING).parse_args_and_config(["--config", "paper_math", *ON_CPU, "--print-config"])
    printed = capsys.readouterr().out.splitlines()
    assert "per_device_train_batch_size: 64  # library default (gave 8; derived)" in printed
    assert "bf16: false  # command line" in printed and "prompts_per_step: 64  # paper_math.yaml" in printed


def test_the_evaluation_recipe_prints_its_settings_too(capsys):
    with pytest.raises(SystemExit) as stop:
        recipe_call("evaluate", "--print-config", stop_at=(trl_multiagent.evaluation, "evaluate"))
    assert stop.value.code == 0
    printed = capsys.readouterr().out.splitlines()
    assert "temperature: 0.7  # paper_eval.yaml" in printed and "k: 1  # library default" in printed
