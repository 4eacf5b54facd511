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


def bf16_device_available() -> bool:
    """Whether this machine trains in bf16 as transformers' TrainingArguments accept it (GPU, XPU, NPU, MPS, XLA)."""
    from transformers import is_torch_xla_available

    from .seams.transformers import is_torch_bf16_gpu_available

    return is_torch_bf16_gpu_available() or is_torch_xla_available()


def recipe_argv(argv: list[str], *, paper_preset: Path, cpu_preset: Path) -> list[str]:
    """A recipe's arguments (``sys.argv``) for its TrlParser: ``--config <paper_preset>`` first when none is given.

    The paper presets train in bf16, which needs an accelerator; without one, transformers would stop while parsing
    them with "Your setup doesn't support bf16/gpu", naming neither the preset nor the way out. Stop here
    instead, naming the CPU preset. ``--bf16`` or ``--use_cpu`` on the command line is the user's own choice: no check.
    """
    script, args = argv[0], list(argv[1:])
    if "--config" in args:
        return args
    paper = read_preset(str(paper_preset))
    chose = any(arg.split("=")[0] in ("--bf16", "--use_cpu") for arg in args)
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
