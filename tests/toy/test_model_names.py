"""Model names: `toy` (and the other shipped names, registered by the toy world) and a user's own names stand for
local folders; every other name or path passes through unchanged."""

from __future__ import annotations

import sys

import pytest

import trl_multiagent.common.model_names as model_names
from trl_multiagent.common.model_names import (
    model_name,
    register_model_name,
    registered_model_names,
    resolve_model_name,
)


def test_other_names_pass_through():
    assert resolve_model_name("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert resolve_model_name("outputs/tiny-qwen3") == "outputs/tiny-qwen3"
    assert model_name("outputs/tiny-qwen3") == "outputs/tiny-qwen3"


@pytest.mark.parametrize("name", ["toy", "toy-judge"])
def test_missing_toy_model_says_how_to_build_it(name, tmp_path, monkeypatch):
    registered_model_names()  # the toy world registered its names
    monkeypatch.setitem(model_names._folders, name, str(tmp_path / "model"))
    with pytest.raises(FileNotFoundError, match="scripts/build_toy_model.py"):
        resolve_model_name(name)


def test_a_user_registers_a_named_model(tiny_model_dir, monkeypatch):
    """What docs/architecture.md tells a user to do: one call, then the name works wherever a model is taken, and a
    run saved on that folder names it."""
    monkeypatch.setattr(model_names, "_folders", dict(model_names._folders))
    register_model_name("my-tiny", tiny_model_dir)
    assert resolve_model_name("my-tiny") == tiny_model_dir
    assert model_name(tiny_model_dir) == "my-tiny"
    register_model_name("my-tiny", tiny_model_dir)  # the same folder again: nothing changes
    with pytest.raises(ValueError, match="already stands for"):
        register_model_name("my-tiny", "/elsewhere")


def test_the_registry_imports_the_toy_world_on_first_lookup(monkeypatch):
    """The core names no registrant: the toy package is imported by the registry's first lookup, through
    `REGISTRANTS`, and registers its three names then."""
    monkeypatch.setattr(model_names, "_folders", {})
    monkeypatch.setattr(model_names, "_registrants_imported", False)
    for module in [m for m in sys.modules if m == "trl_multiagent.toy" or m.startswith("trl_multiagent.toy.")]:
        monkeypatch.delitem(sys.modules, module)
    assert "trl_multiagent.toy" not in sys.modules
    assert set(registered_model_names()) == {"toy", "toy-judge", "toy-search"}
    assert "trl_multiagent.toy" in sys.modules
