"""The toy model's build script, imported once per module for the teacher tests."""

import importlib.util
import sys
from pathlib import Path

import pytest

BUILD_SCRIPT = Path(__file__).parents[2] / "scripts" / "build_toy_model.py"


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("build_toy_model", BUILD_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
