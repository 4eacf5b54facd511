"""The files shipped beside the package: the recipes, their presets (``recipes/configs``) and the accelerate configs.

A pip install ships them inside the wheel (``trl_multiagent/recipes``, ``trl_multiagent/accelerate_configs``); a
checkout has them at its root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def shipped_dir(folder: str) -> Path:
    """``recipes`` or ``accelerate_configs``: inside the installed wheel, else at the root of this checkout."""
    package = Path(__file__).resolve().parent
    for candidate in (package / folder, package.parent / folder):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"{folder}/ is missing next to {package}: reinstall trl-multiagent.")


def shipped_file(value: str, folder: str) -> str:
    """A path as given when it exists, else the shipped ``folder/value.yaml`` (``toy`` -> recipes/configs/toy.yaml)."""
    if os.path.exists(value):
        return value
    shipped = shipped_dir(folder.split("/")[0]).joinpath(*folder.split("/")[1:], f"{Path(value).stem}.yaml")
    if shipped.is_file():
        return str(shipped)
    choices = sorted(p.stem for p in shipped.parent.glob("*.yaml"))
    raise FileNotFoundError(f"{value!r} is neither a file nor a shipped {folder} file; shipped: {choices}.")


def read_preset(value: str) -> dict[str, Any]:
    """The settings of a preset (a path, or a shipped name: ``toy``, ``paper_math``, ...) as its YAML gives them."""
    import yaml

    path = shipped_file(value, "recipes/configs")
    preset = yaml.safe_load(Path(path).read_text())
    if not isinstance(preset, dict):
        raise ValueError(f"{path} must hold a YAML mapping of settings, as recipes/configs/toy.yaml does.")
    return preset
