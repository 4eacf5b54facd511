"""Regenerate the generated parts of docs/configuration.md from the code, the one place each is said:

- our fields (`MultiAgentGRPOConfig` beyond `GRPOConfig`): the help metadata (short) and the class docstring's
  `Parameters:` section (groups and full descriptions, TRL's docstring format), in
  trl_multiagent/config/multiagent_grpo_config.py;
- every field TRL's `GRPOConfig` adds to `TrainingArguments`: honoured, refused or not applicable, with why, from
  trl_multiagent/config/grpo_config_fields.py.

The prose around them is written in docs/configuration.md itself; each generated part sits between a
`<!-- generated: NAME -->` line and a `<!-- end generated -->` line. Every line is at most 119 characters (a list and
sections rather than tables, whose cells cannot wrap).

    python scripts/config_reference.py           # rewrites the generated parts of docs/configuration.md
    python scripts/config_reference.py --check   # exits 1 when they differ from the code

tests/package/test_config_reference.py fails when the committed file is not what this script writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

from transformers import TrainingArguments
from trl import GRPOConfig

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.config.grpo_config_fields import GRPO_CONFIG_FIELDS, HONOURED, REFUSED

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)
WIDTH = 119  # the longest line written
# What markdown reads as the start of a block (a list item, a quote, a heading, a table row) at a line's start.
BLOCK_START = re.compile(r"([-+*>#|]|\d+[.)])(\s|$)")


class Parameter(NamedTuple):
    """One entry of a docstring's `Parameters:` section, TRL's format: `name (header):` then its description."""

    name: str
    header: str  # "`str`, *optional*, defaults to `"shared"`"
    description: str  # its lines joined with spaces


def parameter_groups(docstring: str) -> list[tuple[str, list[Parameter]]]:
    """The `Parameters:` section of ``docstring`` as (group title, its parameters), in order: a `> Title` line opens a
    group (TRL's docstring format)."""
    lines = docstring.expandtabs().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Parameters:")
    indent = len(lines[start]) - len(lines[start].lstrip()) + 4
    groups: list[tuple[str, list[Parameter]]] = []
    name = header = None
    description: list[str] = []

    def close() -> None:
        if name is not None:
            groups[-1][1].append(Parameter(name, header, " ".join(description)))

    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break  # the section ends
        text = line.strip()
        item = re.fullmatch(r"(\w+) \((.*)\):", text) if len(line) - len(line.lstrip()) == indent else None
        if text.startswith("> "):
            close()
            name, groups = None, [*groups, (text[2:], [])]
        elif item:
            close()
            (name, header), description = item.groups(), []
        elif text:
            description.append(text)
    close()
    return groups


def own_fields() -> list[dataclasses.Field]:
    """The fields of `MultiAgentGRPOConfig` that `GRPOConfig` does not have, in declaration order."""
    inherited = {field.name for field in dataclasses.fields(GRPOConfig)}
    return [field for field in dataclasses.fields(MultiAgentGRPOConfig) if field.name not in inherited]


def default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    if field.default_factory is not dataclasses.MISSING:
        return f"`{field.default_factory()!r}`"
    return "required"


def wrapped(text: str, *, first: str = "", rest: str = "") -> str:
    """``text`` in lines of at most ``WIDTH`` characters, the first after ``first``, the others after ``rest``; a word
    that would start a line as a markdown block (``-``, ``1.``, ``#``, ...) stays on the line of the word before it."""
    words = text.split()
    glued = [words[0]] if words else []
    for word in words[1:]:
        if BLOCK_START.fullmatch(word + " "):
            glued[-1] += "\0" + word  # not a space: the wrap cannot break here
        else:
            glued.append(word)
    lines = textwrap.wrap(
        " ".join(glued),
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return "\n".join(line.replace("\0", " ") for line in lines)


def our_fields() -> str:
    """The index of our fields (name, default, help), then each group of the docstring with each field's facts and
    full description, as sections."""
    fields = {field.name: field for field in own_fields()}
    groups = parameter_groups(MultiAgentGRPOConfig.__doc__)
    documented = [p.name for _, parameters in groups for p in parameters]
    for name, field in fields.items():
        if not field.metadata.get("help"):
            raise ValueError(
                f"MultiAgentGRPOConfig.{name} has no help metadata: describe it in "
                "field(..., metadata={'help': ...}) in trl_multiagent/config/multiagent_grpo_config.py."
            )
        if name not in documented:
            raise ValueError(f"MultiAgentGRPOConfig.{name} is not in the class docstring's `Parameters:` section.")
    index = []
    sections = []
    for title, parameters in groups:
        sections.append(f"## {title}\n")
        for parameter in parameters:
            field = fields[parameter.name]
            entry = f"[`{field.name}`](#{field.name}), default {default_of(field)}: {field.metadata['help']}"
            index.append(wrapped(entry, first="- ", rest="  "))
            # as written in config.py (a parser may have replaced `field.type` with the resolved type)
            facts = [f"`{MultiAgentGRPOConfig.__annotations__[field.name]}`", f"default {default_of(field)}"]
            if field.metadata.get("choices"):
                facts.append("one of " + ", ".join(f"`{choice!r}`" for choice in field.metadata["choices"]))
            facts_line, description = wrapped("; ".join(facts) + "."), wrapped(parameter.description)
            sections.append(f"### `{field.name}`\n\n{facts_line}\n\n{description}\n")
    return "\n".join([*index, "", *sections])


def trl_fields() -> str:
    """One entry per field `GRPOConfig` adds to `TrainingArguments`, in TRL's order, from grpo_config_fields.py (no
    defaults: they differ between the TRL releases the range allows, and TRL's documentation has them): a definition
    list, what happens to the field and the test that shows it."""
    entries = []
    for field in dataclasses.fields(GRPOConfig):
        if field.name in TrainingArguments.__dataclass_fields__:
            continue
        use = GRPO_CONFIG_FIELDS.get(field.name)
        if use is None:
            raise ValueError(
                f"trl_multiagent/config/grpo_config_fields.py does not say what happens to `{field.name}`."
            )
        why = f"{use.why}. Instead: {use.instead}" if use.status == REFUSED else use.why
        shown = f"shown by `{use.test}`" if use.status == HONOURED else "shown at construction"
        definition = wrapped(f"**{use.status}**: {why} ({shown}).", first=":   ", rest="    ")
        entries.append(f"`{field.name}`\n{definition}\n")
    return "\n".join(entries)


GENERATED = {"our_fields": our_fields, "trl_fields": trl_fields}


def render(text: str) -> str:
    """``text`` with every generated part written anew."""
    found = {match.group(2) for match in BLOCK.finditer(text)}
    if found != set(GENERATED):
        raise ValueError(
            f"docs/configuration.md must hold the generated parts {sorted(GENERATED)}, has {sorted(found)}"
        )
    return BLOCK.sub(lambda match: match.group(1) + "\n" + GENERATED[match.group(2)]() + "\n" + match.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Compare with docs/configuration.md; write nothing.")
    args = parser.parse_args(argv)
    text = DOCS.read_text()
    rendered = render(text)
    if args.check:
        if rendered != text:
            print(f"{DOCS} is not what the code gives: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    DOCS.write_text(rendered)
    print(f"wrote {DOCS} ({len(own_fields())} fields of ours, {len(GRPO_CONFIG_FIELDS)} of GRPOConfig)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
