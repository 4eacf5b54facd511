"""A Griffe extension (mkdocs.yml loads it for mkdocstrings) that renders TRL's docstring parameter groups.

TRL's configs group their `Parameters:` with `> Group title` lines (its doc-builder's format), which the Google parser
mkdocstrings uses does not know: it would warn on each and drop the titles. Before parsing, each group becomes a bold
title over a `Parameters:` section of its own, so the site shows the groups as the docstring has them, and each item's
header is reduced to its type.
"""

from __future__ import annotations

import re

import griffe

# TRL's item header, `name (`type`, *optional*, defaults to `x`):`, read by the Google parser as `name (type):` (the
# site's table takes the default from the signature)
ITEM = re.compile(r"^(    \w+) \(`([^`]*)`[^)]*\):$")


def split_groups(docstring: str) -> str:
    """``docstring`` (dedented) with every `> Title` line of its `Parameters:` section made a bold title over a new
    `Parameters:` section; unchanged without such lines."""
    out, inside = [], False
    for line in docstring.splitlines():
        text = line.strip()
        if line.rstrip() == "Parameters:":
            inside = True
        elif inside and text and not line.startswith(" "):
            inside = False  # the next section
        elif inside and text.startswith("> "):
            if out and out[-1].rstrip() == "Parameters:":  # the section opens with a group: its title goes first
                out.pop()
            out += ["", f"**{text[2:]}**", "", "Parameters:"]
            continue
        if not text and out and out[-1] == "Parameters:":
            continue  # the Google parser reads a section only if its items follow its title at once
        out.append(ITEM.sub(r"\1 (\2):", line) if inside else line)
    return "\n".join(out)


class ParameterGroups(griffe.Extension):
    def on_class_instance(self, *, cls: griffe.Class, **kwargs) -> None:
        if cls.docstring is not None and "\n    > " in cls.docstring.value:
            cls.docstring.value = split_groups(cls.docstring.value)
