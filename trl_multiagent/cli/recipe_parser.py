"""``RecipeParser``: the recipes' ``TrlParser``, reading presets that build on one another.

``--config`` takes a YAML file or a shipped preset's name; that file and the presets it builds on (``base:``, see
``shipped.preset_layers``) are merged into the one settings file TrlParser reads, and the command line wins over them
all. At start-up one line says which layers made the settings (``settings: library defaults + paper_math.yaml +
toy.yaml + command line``); ``--print_config`` (or ``--print-config``) prints every setting with the layer it came
from, then exits. A training recipe's parser also takes ``--validate`` (validation.py): the recipe then makes every
check the trainer would make of its settings and exits. Both parse a GPU run's settings on any machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from transformers import TrainingArguments
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from ..seams.transformers import bf16_accepted_without_device
from .shipped import BASE, PresetLayer, merged_settings, preset_layers
from .validation import (
    PRINT_CONFIG,
    PRINT_CONFIG_ALIAS,
    VALIDATE,
    planned_launch_of_this_process,
    planned_world,
    refuse,
    rows_for_checks,
    stand_for_the_launch,
    validate_run,
)

LIBRARY = "library default"
COMMAND_LINE = "command line"
EPILOG = (
    f"--config FILE: a preset, a YAML file or a shipped name (toy, paper_math, ...); `{BASE}: NAME` at its top builds "
    "it on another preset, of which it replaces what it sets. A flag given here wins over every preset. "
    f"{PRINT_CONFIG} (alias {PRINT_CONFIG_ALIAS}): print every setting with where it came from (library default, "
    "which preset file, command line) and exit."
)
VALIDATE_EPILOG = (
    f" {VALIDATE}: make every check the trainer would make of these settings, under this launch (DeepSpeed or not, "
    "the number of processes), without loading the model or touching a GPU; print what would run and exit (1 if "
    "refused)."
)
_NOT_GIVEN = object()


class RecipeParser(TrlParser):
    """``TrlParser`` whose ``--config`` preset may build on others (``base:``), saying which layers made the settings.

    A preset without ``base:`` reads as TrlParser reads it: its settings over the dataclasses' defaults.
    ``validates``: the script takes ``--validate`` (it calls ``validate_if_asked`` once its workflow is built); other
    scripts refuse the flag rather than run for real.
    """

    def __init__(self, dataclass_types: Iterable[type] | type, *, validates: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG + (VALIDATE_EPILOG if validates else ""))
        super().__init__(dataclass_types, **kwargs)
        self.validates = validates
        self.validating = False  # --validate was given
        self.settings = ""  # the settings line of the last parse
        self.outputs: tuple[Any, ...] = ()  # the dataclasses of the last parse

    def parse_args_and_config(
        self,
        args: Iterable[str] | None = None,
        return_remaining_strings: bool = False,
        fail_with_unknown_args: bool = True,
        separate_remaining_strings: bool = False,
    ) -> tuple[Any, ...]:
        args = list(sys.argv[1:] if args is None else args)
        print_config = any(arg in (PRINT_CONFIG, PRINT_CONFIG_ALIAS) for arg in args)
        self.validating = VALIDATE in args
        if self.validating and not self.validates:
            self.error(
                f"{VALIDATE} checks a training run's settings; this script has none: {PRINT_CONFIG} checks its own."
            )
        args = [arg for arg in args if arg not in (PRINT_CONFIG, PRINT_CONFIG_ALIAS, VALIDATE)]
        layers, command_line = self._layers(args)
        with tempfile.TemporaryDirectory() as folder, self._settings_only(print_config or self.validating):
            if layers:  # TrlParser reads one file: the chain merged, or the file itself when it builds on none
                merged = Path(folder) / "settings.yaml"
                if len(layers) > 1:
                    merged.write_text(yaml.safe_dump(merged_settings(layers), sort_keys=False))
                config = str(merged) if len(layers) > 1 else str(layers[-1].path)
                args = ["--config", config, *command_line]
            try:
                outputs = super().parse_args_and_config(
                    args, return_remaining_strings, fail_with_unknown_args, separate_remaining_strings
                )
            except ValueError as error:
                if not self.validating:
                    raise
                refuse(f"the settings are refused as they are parsed: {error}")
        given = self._given(command_line)
        self.settings = settings_line(layers, bool(given))
        if os.environ.get("RANK", "0") == "0":  # once per run: a launcher sets RANK in every process it starts
            print(self.settings, file=sys.stderr, flush=True)
        if print_config:
            print(self.describe(outputs, layers, given))
            sys.exit(0)
        self.outputs = outputs
        return outputs

    def validate_if_asked(self, workflow, task) -> None:
        """With ``--validate``: every check the trainer would make of the parsed settings with ``workflow``, on
        ``task``'s dataset (validation.py), then exit; without it, nothing. A training recipe calls it once its
        workflow is built, before it loads anything."""
        if not self.validating:
            return
        script_args, args, model_args = (
            next(output for output in self.outputs if isinstance(output, kind))
            for kind in (ScriptArguments, TrainingArguments, ModelConfig)
        )
        validate_run(
            args,
            workflow,
            model=model_args.model_name_or_path,
            peft_config=get_peft_config(model_args),
            dataset=rows_for_checks(
                task, script_args.dataset_name, split=script_args.dataset_train_split, seed=args.seed
            ),
            settings=self.settings,
        )

    @contextmanager
    def _settings_only(self, on: bool) -> Iterator[None]:
        """Parsing for ``--print_config`` or ``--validate``: nothing will train, so a GPU run's settings parse on any
        machine (``bf16`` accepted without a bf16 device), and the launch a validation stands for sets the number of
        processes the settings count with (validation.py)."""
        if not on:
            yield
            return
        stand_for_the_launch()  # under the launcher itself: its processes and machines, and no process group
        planned = planned_launch_of_this_process()
        types = self.dataclass_types
        if planned is not None:
            self.dataclass_types = [
                planned_world(t, planned.processes) if issubclass(t, TrainingArguments) else t for t in types
            ]
        try:
            with bf16_accepted_without_device():
                yield
        finally:
            self.dataclass_types = types

    def _layers(self, args: list[str]) -> tuple[list[PresetLayer], list[str]]:
        """The preset chain ``--config`` names (none without it) and the arguments besides it."""
        if "--config" not in args:
            return [], args
        at = args.index("--config")
        if at + 1 == len(args):
            self.error("--config takes a preset: a YAML file or a shipped name (toy, paper_math, ...).")
        return preset_layers(args[at + 1]), args[:at] + args[at + 2 :]

    def _given(self, command_line: Sequence[str]) -> dict[str, Any]:
        """The settings ``command_line`` sets, as the parser converts them: argparse fills a namespace attribute only
        for the flags it reads when every attribute is there already."""
        unread = {action.dest: _NOT_GIVEN for action in self._actions}
        namespace, _ = self.parse_known_args(list(command_line), namespace=argparse.Namespace(**unread))
        return {name: value for name, value in vars(namespace).items() if value is not _NOT_GIVEN}

    def describe(self, outputs: Sequence[Any], layers: list[PresetLayer], given: dict[str, Any]) -> str:
        """Every setting of ``outputs`` (the parsed dataclasses), one a line with the layer it came from; where the
        dataclass's own checks changed the value that layer gave, that value too."""
        merged = merged_settings(layers)
        lines = [f"# {settings_line(layers, bool(given))}"]
        for dataclass_type, output in zip(self.dataclass_types, outputs):
            lines.append(f"# {dataclass_type.__name__}")
            for field in dataclasses.fields(output):
                if not field.init:
                    continue
                source, given_value = _source(field, layers, given, merged)
                value = getattr(output, field.name)
                note = "" if _plain(value) == _plain(given_value) else f" (gave {_shown(given_value)}; derived)"
                lines.append(f"{field.name}: {_shown(value)}  # {source}{note}")
        return "\n".join(lines)


def settings_line(layers: list[PresetLayer], command_line: bool) -> str:
    """``settings: library defaults + paper_math.yaml + toy.yaml + command line``: the layers, lowest first."""
    parts = ["library defaults", *(layer.path.name for layer in layers), *([COMMAND_LINE] if command_line else [])]
    return "settings: " + " + ".join(parts)


def _source(
    field: dataclasses.Field, layers: list[PresetLayer], given: dict[str, Any], merged: dict[str, Any]
) -> tuple[str, Any]:
    """Where ``field``'s setting came from, and the value it gave there."""
    if field.name in given:
        return COMMAND_LINE, given[field.name]
    for layer in reversed(layers):
        if field.name in layer.settings:
            return layer.path.name, merged[field.name]
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    return LIBRARY, default


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def _shown(value: Any) -> str:
    return json.dumps(_plain(value), default=str)
