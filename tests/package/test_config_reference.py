"""The config fields are described once, in their help metadata; docs/configuration.md is generated from it."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from trl import GRPOConfig, TrlParser

from trl_multiagent import MultiAgentGRPOConfig

ROOT = Path(__file__).resolve().parents[2]


def config_reference():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_is_what_the_metadata_gives():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == config_reference().render(), "run `python scripts/config_reference.py` and commit the result"


def test_the_reference_lists_our_fields_only_each_with_its_help():
    reference = config_reference()
    inherited = {field.name for field in dataclasses.fields(GRPOConfig)}
    ours = [field for field in dataclasses.fields(MultiAgentGRPOConfig) if field.name not in inherited]
    assert [field.name for field in reference.own_fields()] == [field.name for field in ours]
    text = reference.render()
    for field in ours:
        assert f"### `{field.name}`\n" in text and field.metadata["help"] in text
    assert "### `beta`" not in text and "### `num_generations`" not in text  # TRL's own, documented by TRL


def test_a_field_without_help_is_refused(monkeypatch):
    reference = config_reference()
    bare = dataclasses.field(default=None)
    bare.name, bare.type = "undocumented", "int | None"
    monkeypatch.setattr(reference, "own_fields", lambda: [bare])
    with pytest.raises(ValueError, match="MultiAgentGRPOConfig.undocumented has no help metadata"):
        reference.render()


def test_the_reference_does_not_depend_on_a_parser_having_run():
    """HfArgumentParser replaces each Field's `type` string with the resolved type; the reference reads the source."""
    before = config_reference().render()
    TrlParser((MultiAgentGRPOConfig,))
    assert config_reference().render() == before
