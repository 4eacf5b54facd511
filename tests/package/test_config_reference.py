"""The config fields are described once, in the code: our fields' help metadata (short) and the class docstring
(grouped, full), and what the trainer does with each of TRL's GRPOConfig fields (grpo_config_fields.py);
docs/configuration.md's generated parts are written from them."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from trl import GRPOConfig, TrlParser

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.config.grpo_config_fields import GRPO_CONFIG_FIELDS

ROOT = Path(__file__).resolve().parents[2]


def config_reference():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ours() -> list[dataclasses.Field]:
    inherited = {field.name for field in dataclasses.fields(GRPOConfig)}
    return [field for field in dataclasses.fields(MultiAgentGRPOConfig) if field.name not in inherited]


def test_the_committed_reference_is_what_the_code_gives():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == config_reference().render(committed), "run `python scripts/config_reference.py` and commit"


def test_each_help_is_short_and_each_field_is_in_the_grouped_docstring_with_its_default():
    """What `--help` prints fits in 200 characters; the docstring (TRL's format: `> Group` lines in `Parameters:`)
    holds every field once, under a group, its header saying the field's default."""
    groups = config_reference().parameter_groups(MultiAgentGRPOConfig.__doc__)
    documented = {p.name: p for _, parameters in groups for p in parameters}
    assert len(groups) > 1 and all(parameters for _, parameters in groups)
    assert sum(len(parameters) for _, parameters in groups) == len(documented)
    assert sorted(documented) == sorted(field.name for field in ours())
    long = {field.name: len(field.metadata["help"]) for field in ours() if len(field.metadata["help"]) > 200}
    assert long == {}, "help is the short form: move the details to the class docstring"
    for field in ours():
        parameter = documented[field.name]
        assert parameter.description, field.name
        if field.default is None:
            assert "defaults to" not in parameter.header, field.name
        else:
            said = f'"{field.default}"' if isinstance(field.default, str) else repr(field.default)
            assert f"defaults to `{said}`" in parameter.header, f"{field.name}: {parameter.header}"


def test_the_reference_lists_our_fields_with_their_help_and_description_and_every_trl_field():
    reference = config_reference()
    text = reference.our_fields()
    descriptions = {
        p.name: p.description for _, ps in reference.parameter_groups(MultiAgentGRPOConfig.__doc__) for p in ps
    }
    words = " ".join(text.split())  # the text as read: its line breaks are spaces
    for field in ours():
        assert f"### `{field.name}`\n" in text and " ".join(field.metadata["help"].split()) in words
        assert " ".join(descriptions[field.name].split()) in words
    assert "### `beta`" not in text and "### `num_generations`" not in text  # TRL's own, in the other list
    listed = reference.trl_fields()
    for name, use in GRPO_CONFIG_FIELDS.items():
        assert f"`{name}`\n:   **{use.status}**: " in listed


def test_the_generated_lines_are_readable_and_stay_markdown_blocks():
    """Every generated line fits in 119 characters, and no wrapped line starts a list item, a heading, a quote or a
    table row that the text did not mean (a list and sections, not tables: a table cell cannot wrap)."""
    reference = config_reference()
    for text in (reference.our_fields(), reference.trl_fields()):
        long = [line for line in text.splitlines() if len(line) > reference.WIDTH]
        assert long == [], long[:3]
        assert "| --- |" not in text
    wrapped = reference.wrapped("a " * 58 + "- b 1. c " + "d " * 60, rest="    ")
    lines = wrapped.splitlines()
    assert len(lines) > 1 and all(len(line) <= reference.WIDTH for line in lines)
    assert not any(reference.BLOCK_START.match(line.strip()) for line in lines[1:])
    assert " ".join(wrapped.split()) == " ".join(("a " * 58 + "- b 1. c " + "d " * 60).split())


def test_a_field_without_help_is_refused(monkeypatch):
    reference = config_reference()
    bare = dataclasses.field(default=None)
    bare.name, bare.type = "undocumented", "int | None"
    monkeypatch.setattr(reference, "own_fields", lambda: [bare])
    with pytest.raises(ValueError, match="MultiAgentGRPOConfig.undocumented has no help metadata"):
        reference.our_fields()


def test_the_reference_does_not_depend_on_a_parser_having_run():
    """HfArgumentParser replaces each Field's `type` string with the resolved type; the reference reads the source."""
    before = config_reference().our_fields()
    TrlParser((MultiAgentGRPOConfig,))
    assert config_reference().our_fields() == before


def test_the_docs_site_renders_each_group_as_a_titled_parameters_table():
    """mkdocstrings' Google parser warns on TRL's `> Group` lines and drops them; the site's Griffe extension
    (scripts/griffe_parameter_groups.py, loaded by mkdocs.yml) turns each group into a title over its own table."""
    import inspect
    import logging

    griffe = pytest.importorskip("griffe")  # the docs extra's (CI's site build step installs it)

    spec = importlib.util.spec_from_file_location("groups", ROOT / "scripts" / "griffe_parameter_groups.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "griffe_parameter_groups.py:ParameterGroups" in (ROOT / "mkdocs.yml").read_text()
    docstring = inspect.cleandoc(MultiAgentGRPOConfig.__doc__)
    groups = config_reference().parameter_groups(MultiAgentGRPOConfig.__doc__)
    logger = logging.getLogger("griffe")
    with pytest.MonkeyPatch.context() as patch:
        said = []
        patch.setattr(logger, "warning", lambda message, *args, **kwargs: said.append(message % args))
        sections = griffe.Docstring(module.split_groups(docstring), parser="google").parse()
    assert said == []
    tables = [[p.name for p in section.value] for section in sections if section.kind.value == "parameters"]
    assert tables == [[p.name for p in parameters] for _, parameters in groups]
    texts = "\n".join(section.value for section in sections if section.kind.value == "text")
    assert all(f"**{title}**" in texts for title, _ in groups)
