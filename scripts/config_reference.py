"""Regenerate the generated parts of docs/configuration.md from the code, the one place each is said:

- our fields (`MultiAgentGRPOConfig` beyond `GRPOConfig`): the help metadata (short) and the class docstring's
  `Parameters:` section (groups and full descriptions, TRL's docstring format), in
  trl_multiagent/config/multiagent_grpo_config.py;
- every field TRL's `GRPOConfig` adds to `TrainingArguments`: honoured, refused or not applicable, with why, from
  trl_multiagent/config/grpo_config_fields.py.

The prose around them is written in docs/configuration.md itself; each generated part sits between a
`<!-- generated: NAME -->` line and a `<!-- end generated -->` line.

    python scripts/config_reference.py           # rewrites the generated parts of docs/configuration.md
    python scripts/config_reference.py --check   # exits 1 when they differ from the code

tests/package/test_config_reference.py fails when the committed file is not what this script writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import NamedTuple

from transformers import TrainingArguments
from trl import GRPOConfig

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.config.grpo_config_fields import GRPO_CONFIG_FIELDS, HONOURED, REFUSED

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)


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


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def our_fields() -> str:
    """The index of our fields (name, default, help), then each group of the docstring with each field's facts and
    full description."""
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
    index = ["| field | default | what it does |", "| --- | --- | --- |"]
    sections = []
    for title, parameters in groups:
        sections.append(f"## {title}\n")
        for parameter in parameters:
            field = fields[parameter.name]
            index.append(
                f"| [`{field.name}`](#{field.name}) | {cell(default_of(field))} | {cell(field.metadata['help'])} |"
            )
            # as written in config.py (a parser may have replaced `field.type` with the resolved type)
            facts = [f"`{MultiAgentGRPOConfig.__annotations__[field.name]}`", f"default {default_of(field)}"]
            if field.metadata.get("choices"):
                facts.append("one of " + ", ".join(f"`{choice!r}`" for choice in field.metadata["choices"]))
            sections.append(f"### `{field.name}`\n\n{'; '.join(facts)}.\n\n{parameter.description}\n")
    return "\n".join([*index, "", *sections])


def trl_fields() -> str:
    """One row per field `GRPOConfig` adds to `TrainingArguments`, in TRL's order, from grpo_config_fields.py (no
    defaults: they differ between the TRL releases the range allows, and TRL's documentation has them)."""
    rows = ["| field | here | what it does here, or why not | shown by |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(GRPOConfig):
        if field.name in TrainingArguments.__dataclass_fields__:
            continue
        use = GRPO_CONFIG_FIELDS.get(field.name)
        if use is None:
            raise ValueError(
                f"trl_multiagent/config/grpo_config_fields.py does not say what happens to `{field.name}`."
            )
        why = f"{use.why}. Instead: {use.instead}" if use.status == REFUSED else use.why
        shown = f"`{use.test}`" if use.status == HONOURED else "construction"
        rows.append(f"| `{field.name}` | {use.status} | {cell(why)} | {shown} |")
    return "\n".join(rows) + "\n"


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
