"""Recipes accept `toy` for the packaged toy model; every other name or path passes through unchanged."""

from __future__ import annotations

import pytest

import trl_multiagent.toy as toy


def test_other_names_pass_through():
    assert toy.resolve_model_name("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert toy.resolve_model_name("outputs/tiny-qwen3") == "outputs/tiny-qwen3"


@pytest.mark.parametrize("name", ["toy", "toy-judge"])
def test_missing_toy_model_says_how_to_build_it(name, tmp_path, monkeypatch):
    monkeypatch.setitem(toy.SHIPPED_MODELS, name, str(tmp_path / "model"))
    with pytest.raises(FileNotFoundError, match="scripts/build_toy_model.py"):
        toy.resolve_model_name(name)
