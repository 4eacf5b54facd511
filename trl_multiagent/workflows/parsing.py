r"""Reading structured answers out of model text: boxed answers, code, verdicts, selections, strategies.

Pure functions, no model. One rule per question, used everywhere it is asked: by the workflows (``formats.py``
binds them to roles), by the rewards (``tasks.math.extract_boxed`` and ``tasks.code.extract_code`` are these
functions), by the per-role metrics and by the evaluators. Small models under RL often drift from the requested
format, so the workflow-facing readers have documented fallbacks instead of raising.

Shared conventions:

- Only the text after the last ``</think>`` is read (a reasoning model's answer follows its thinking).
- Boxes are ``\boxed{...}`` or ``\fbox{...}`` with nested braces matched, or ``\boxed 5`` (the next token).
- When several candidates appear, the **last** one counts: the last box for an answer, the last verdict box, the
  last in-range selection box, the last code block. A judge that changes its mind ends with its final word, and a
  judge that restates a candidate's answer (``Solution 1 says \boxed{3}``) before choosing is read by its choice.
  (The reference implementation reads the first verdict and selection box; see the README's preset list.)
"""

from __future__ import annotations

import re

_THINK_END = "</think>"
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_BARE_ARGUMENT = re.compile(r"[^\s$]+")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_SELECTION = re.compile(r"(?:solution|candidate)?\s*#?\s*(\d+)\s*\.?", re.IGNORECASE)
_BARE_DIGIT = re.compile(r"\b([1-9])\b")
_STRATEGY_HEADER = re.compile(r"STRATEGY\s*\d+\s*\**\s*:", re.IGNORECASE)
_NUMBERED_ITEM = re.compile(r"^[ \t]*\**\d+[.)]\**[ \t]+", re.MULTILINE)
_MARKDOWN_DECORATION = " \t\r\n*#->"  # bold markers, headings and bullets around a strategy
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "python3", "py", ""}


def answer_part(text: str) -> str:
    """The text after the last ``</think>``, or the whole text when there is none."""
    return text.rsplit(_THINK_END, 1)[-1]


def _boxes(text: str) -> list[str | None]:
    r"""The content of every box, ordered by where each box opens; ``None`` for a box that never closes.

    ``\boxed{\frac{1}{2}}`` gives ``\frac{1}{2}``; ``\boxed{\boxed{1}}`` gives the outer then the inner content;
    ``\boxed 5`` gives ``5``. A box cut off at the token limit is ``None``.
    """
    contents: list[str | None] = []
    for match in _BOX.finditer(text):
        start = match.end()
        if start < len(text) and text[start] != "{":
            token = _BARE_ARGUMENT.match(text, start)
            contents.append(token.group(0) if token else None)
            continue
        depth, content = 0, None
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                content = text[start + 1 : end].strip()
                break
        contents.append(content)
    return contents


def _plain(content: str) -> str:
    r"""Box content without LaTeX decoration: ``\text{ Correct }`` -> ``Correct``."""
    return _LATEX_COMMAND.sub("", content).replace("{", "").replace("}", "").strip()


def last_boxed(text: str) -> str | None:
    r"""The content of the last box after any ``</think>``, stripped; ``None`` when there is none.

    "Last" is the box that opens last, so ``\boxed{\boxed{1}}`` gives ``1``. An unclosed last box (an answer cut off
    at the token limit) gives ``None``: the answer was never finished, even if an earlier box was.
    """
    boxes = _boxes(answer_part(text))
    return boxes[-1] if boxes else None


def parse_verdict(text: str) -> bool | None:
    r"""An evaluator's verdict: ``True`` for ``\boxed{Correct}``, ``False`` for ``\boxed{Incorrect}``.

    Case-insensitive; LaTeX wrappers and punctuation inside the box are ignored (``\boxed{\text{correct.}}``).
    The last verdict box wins; boxes holding anything else, such as a restated answer ``\boxed{42}``, are skipped.
    ``None`` when no box holds a verdict; Eval-Opt treats that as "not satisfied" and retries.
    """
    for content in reversed(_boxes(answer_part(text))):
        if content is not None:
            word = _plain(content).strip(".!").lower()
            if word in ("correct", "incorrect"):
                return word == "correct"
    return None


def parse_selection(text: str, n_candidates: int) -> tuple[int, bool]:
    r"""The 0-based index of the candidate an aggregator picked, and whether the primary rule read it.

    Primary: the last box holding a number ``1 <= i <= n_candidates`` (``\boxed{Solution 2}`` too), giving
    ``(i - 1, True)``. Fallbacks, with ``False``: the first standalone digit 1-9 that is at most ``n_candidates``;
    otherwise candidate 0.
    """
    if n_candidates < 1:
        raise ValueError(f"parse_selection needs at least one candidate, got n_candidates={n_candidates}.")
    text = answer_part(text)
    for content in reversed(_boxes(text)):
        match = _SELECTION.fullmatch(_plain(content)) if content is not None else None
        if match and 1 <= int(match.group(1)) <= n_candidates:
            return int(match.group(1)) - 1, True
    for match in _BARE_DIGIT.finditer(text):
        if int(match.group(1)) <= n_candidates:
            return int(match.group(1)) - 1, False
    return 0, False


def _split_at(headers: list[re.Match], text: str) -> list[str]:
    ends = [header.start() for header in headers[1:]] + [len(text)]
    items = [text[header.end() : end].strip(_MARKDOWN_DECORATION) for header, end in zip(headers, ends)]
    return [item for item in items if item]


def parse_strategies(text: str, n: int) -> list[str]:
    """The strategies an orchestrator proposed as ``STRATEGY k: ...``, in order of appearance, at most ``n``.

    A strategy runs from its header to the next header (or the end), so it may span lines. Headers are
    case-insensitive and may carry markdown (``**Strategy 2:**``, ``- STRATEGY 2:``); empty strategies are
    dropped. An empty list when there is no header: see ``read_strategies`` for the fallbacks.
    """
    return _split_at(list(_STRATEGY_HEADER.finditer(answer_part(text))), answer_part(text))[:n]


def read_strategies(text: str, n: int) -> list[str]:
    """Between 1 and ``n`` strategies from an orchestrator's output, with the reference workflow's fallbacks.

    In order, the first rule that finds any: ``STRATEGY k:`` headers (``parse_strategies``); a numbered list
    (``1.`` or ``1)`` at a line start, each item up to the next); the non-empty lines; the whole text (possibly
    empty). At most ``n`` are kept.
    """
    text = answer_part(text)
    for strategies in (
        parse_strategies(text, n),
        _split_at(list(_NUMBERED_ITEM.finditer(text)), text),
        [line.strip(_MARKDOWN_DECORATION) for line in text.splitlines() if line.strip(_MARKDOWN_DECORATION)],
    ):
        if strategies:
            return strategies[:n]
    return [text.strip()]


def last_code_block(text: str) -> str | None:
    """The code of the last closed fenced block after any ``</think>``, tagged python, python3, py or untagged.

    Blocks tagged with another language are skipped, and so is a block cut off by the token limit (no closing
    fence) and an empty one; ``None`` when none is left. The code reward runs exactly this.
    """
    blocks = [body for tag, body in _FENCE.findall(answer_part(text)) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1].strip() if blocks and blocks[-1].strip() else None
