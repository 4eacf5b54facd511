"""The files shipped beside the package: the recipes, their presets (``recipes/configs``) and the accelerate configs.

A pip install ships them inside the wheel (``trl_multiagent/recipes``, ``trl_multiagent/accelerate_configs``); a
checkout has them at its root. A preset may build on another: ``base: paper_math`` at its top (a shipped preset's
name, or a path relative to the file) starts from that preset's settings, and the file's own keys replace the base's,
each whole (a mapping too); the base may have a base of its own (``preset_layers``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .validation import SETTINGS_ONLY

BASE = "base"  # the key by which a preset names the preset it builds on


def shipped_dir(folder: str) -> Path:
    """``recipes`` or ``accelerate_configs``: inside the installed wheel, else at the root of this checkout."""
    package = Path(__file__).resolve().parents[1]  # trl_multiagent/
    for candidate in (package / folder, package.parent / folder):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"{folder}/ is missing next to {package}: reinstall trl-multiagent.")


def shipped_file(value: str, folder: str) -> str:
    """A file's path as given when it is one, else the shipped ``folder/value.yaml`` (``toy`` ->
    recipes/configs/toy.yaml)."""
    if os.path.isfile(value):
        return value
    shipped = shipped_dir(folder.split("/")[0]).joinpath(*folder.split("/")[1:], f"{Path(value).stem}.yaml")
    if shipped.is_file():
        return str(shipped)
    choices = sorted(p.stem for p in shipped.parent.glob("*.yaml"))
    raise FileNotFoundError(f"{value!r} is neither a file nor a shipped {folder} file; shipped: {choices}.")


@dataclass(frozen=True)
class PresetLayer:
    """One file of a preset chain: its path and the settings it sets itself (``base`` left out)."""

    path: Path
    settings: dict[str, Any]


def preset_layers(value: str) -> list[PresetLayer]:
    """The preset ``value`` (a path, or a shipped name: ``toy``, ``paper_math``, ...) and, through ``base:``, the
    presets it builds on: the deepest base first, ``value``'s own file last."""
    import yaml

    chain: list[PresetLayer] = []
    path = Path(shipped_file(value, "recipes/configs"))
    while True:
        if any(path.resolve() == layer.path.resolve() for layer in chain):
            loop = " -> ".join(str(layer.path) for layer in chain)
            raise ValueError(
                f"The presets build on one another in a loop: {loop} -> {path}. Remove `{BASE}:` from one of them."
            )
        settings = yaml.safe_load(path.read_text())
        if not isinstance(settings, dict):
            raise ValueError(f"{path} must hold a YAML mapping of settings, as recipes/configs/toy.yaml does.")
        base = settings.pop(BASE, None)
        chain.append(PresetLayer(path, settings))
        if base is None:
            return chain[::-1]
        path = _base_file(base, path)


def _base_file(base: Any, named_in: Path) -> Path:
    """``base:`` of ``named_in``: a path relative to that file (or absolute), else a shipped preset's name."""
    if not isinstance(base, str):
        raise ValueError(
            f"{named_in}: `{BASE}:` takes one preset, a path or a shipped name (e.g. `{BASE}: paper_math`), got "
            f"{base!r}; to build on two presets, let one of them build on the other."
        )
    try:
        return Path(shipped_file(str(named_in.parent / base), "recipes/configs"))
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{named_in}: `{BASE}: {base}`: {error}") from None


def merged_settings(layers: list[PresetLayer]) -> dict[str, Any]:
    """The settings of a preset chain (``preset_layers``): a key a file sets replaces its base's value."""
    settings: dict[str, Any] = {}
    for layer in layers:
        settings.update(layer.settings)
    return settings


def read_preset(value: str) -> dict[str, Any]:
    """The settings of a preset (a path, or a shipped name: ``toy``, ``paper_math``, ...), those of the presets it
    builds on included."""
    return merged_settings(preset_layers(value))


def bf16_device_available() -> bool:
    """Whether this machine trains in bf16 as transformers' TrainingArguments accept it (GPU, XPU, NPU, MPS, XLA)."""
    from transformers import is_torch_xla_available

    from ..seams.transformers import is_torch_bf16_gpu_available

    return is_torch_bf16_gpu_available() or is_torch_xla_available()


def recipe_argv(argv: list[str], *, paper_preset: Path, cpu_preset: Path) -> list[str]:
    """A recipe's arguments (``sys.argv``) for its TrlParser: ``--config <paper_preset>`` first when none is given.

    The paper presets train in bf16, which needs an accelerator; without one, transformers would stop while parsing
    them with "Your setup doesn't support bf16/gpu", naming neither the preset nor the way out. Stop here
    instead, naming the CPU preset. ``--bf16`` or ``--use_cpu`` on the command line is the user's own choice: no check;
    ``--print_config`` and ``--validate`` train nothing, so they need no device either.
    """
    script, args = argv[0], list(argv[1:])
    if "--config" in args:
        return args
    paper = read_preset(str(paper_preset))
    chose = any(arg.split("=")[0] in ("--bf16", "--use_cpu", *SETTINGS_ONLY) for arg in args)
    if paper.get("bf16", False) and not chose and not bf16_device_available():
        raise SystemExit(
            f"{_shown(script)} without --config runs the paper's settings ({_shown(paper_preset)}: "
            f"{paper.get('model_name_or_path')} in bf16), which need a GPU; this machine has none for bf16. "
            "On CPU, run the toy preset:\n"
            f"    accelerate launch --config_file {_shown(shipped_dir('accelerate_configs') / 'cpu.yaml')} "
            f"{_shown(script)} --config {_shown(cpu_preset)}"
        )
    return ["--config", str(paper_preset), *args]


def _shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (as a user would type it), else absolute."""
    relative = os.path.relpath(os.path.abspath(path))
    return str(path) if relative.startswith("..") else relative
