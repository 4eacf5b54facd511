r"""Reading structured answers out of model text: boxed answers, verdicts, selections, strategies, code.

Pure functions, no model. Small models under RL often drift from the requested format, so every parser has a
documented fallback instead of raising: a workflow must always be able to finish its episode.
"""

from __future__ import annotations

import re

_BOXED_OPEN = re.compile(r"\\boxed\s*\{")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_SELECTION = re.compile(r"(?:solution|candidate)?\s*#?\s*(\d+)\s*\.?", re.IGNORECASE)
_BARE_DIGIT = re.compile(r"\b([1-9])\b")
_STRATEGY_HEADER = re.compile(r"STRATEGY\s*\d+\s*\**\s*:", re.IGNORECASE)
_MARKDOWN_DECORATION = " \t\r\n*#->"  # bold markers, headings and bullets around a strategy header
_PYTHON_BLOCK = re.compile(r"```(?:python3|python|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _boxed_contents(text: str) -> list[str]:
    """Contents of every closed ``\\boxed{...}``, ordered by where each box opens.

    Braces are counted, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. A box that never closes (an output cut
    at the token limit) is skipped.
    """
    contents = []
    for match in _BOXED_OPEN.finditer(text):
        depth = 1
        for end in range(match.end(), len(text)):
            if text[end] == "{":
                depth += 1
            elif text[end] == "}":
                depth -= 1
                if depth == 0:
                    contents.append(text[match.end() : end])
                    break
    return contents


def _plain(content: str) -> str:
    """Box content without LaTeX decoration: ``\\text{ Correct }`` -> ``Correct``."""
    return _LATEX_COMMAND.sub("", content).replace("{", "").replace("}", "").strip()


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` in ``text``, or ``None`` if there is none.

    Nested braces are matched. "Last" means the box that opens last, so ``\boxed{\boxed{1}}`` gives ``1``.
    Fallback: an unclosed final box (truncated output) is ignored and the previous closed box is returned.
    """
    contents = _boxed_contents(text)
    return contents[-1] if contents else None


def parse_verdict(text: str) -> bool | None:
    r"""An evaluator's verdict: ``True`` for ``\boxed{Correct}``, ``False`` for ``\boxed{Incorrect}``.

    Case-insensitive; LaTeX wrappers and punctuation inside the box are ignored (``\boxed{\text{correct.}}``).
    When several verdict boxes appear (a judge changing its mind), the last one wins; boxes holding anything else,
    such as a restated answer ``\boxed{42}``, are skipped. Fallback: ``None`` when no box holds a verdict; Eval-Opt
    treats that as "not satisfied".
    """
    for content in reversed(_boxed_contents(text)):
        word = _plain(content).strip(".!").lower()
        if word in ("correct", "incorrect"):
            return word == "correct"
    return None


def parse_selection(text: str, n_candidates: int) -> tuple[int, bool]:
    r"""The 0-based index of the candidate an aggregator picked, and whether the primary parse succeeded.

    Primary: the last ``\boxed{i}`` with ``1 <= i <= n_candidates`` (``\boxed{Solution 2}`` is accepted too); the
    answer is ``(i - 1, True)``. Fallbacks, with ``False``: the first standalone digit 1-9 in the text that is at
    most ``n_candidates``; otherwise candidate 0.
    """
    if n_candidates < 1:
        raise ValueError(f"parse_selection needs at least one candidate, got n_candidates={n_candidates}.")
    for content in reversed(_boxed_contents(text)):
        match = _SELECTION.fullmatch(_plain(content))
        if match and 1 <= int(match.group(1)) <= n_candidates:
            return int(match.group(1)) - 1, True
    for match in _BARE_DIGIT.finditer(text):
        if int(match.group(1)) <= n_candidates:
            return int(match.group(1)) - 1, False
    return 0, False


def parse_strategies(text: str, n: int) -> list[str]:
    """The strategies an orchestrator proposed as ``STRATEGY k: ...``, in order of appearance, at most ``n``.

    A strategy runs from its header to the next header (or the end), so it may span lines. Headers are
    case-insensitive and may carry markdown (``**Strategy 2:**``, ``- STRATEGY 2:``); empty strategies are
    dropped. Fallback: an empty list when there is no header; the caller decides what to assign instead.
    """
    headers = list(_STRATEGY_HEADER.finditer(text))
    ends = [header.start() for header in headers[1:]] + [len(text)]
    strategies = [text[header.end() : end].strip(_MARKDOWN_DECORATION) for header, end in zip(headers, ends)]
    return [strategy for strategy in strategies if strategy][:n]


def last_code_block(text: str) -> str | None:
    """The code in the last closed ```` ```python ```` fenced block (``py`` and ``python3`` tags too).

    Fallback: ``None`` when there is no closed python block; untagged fences and a block cut off by the token limit
    are not treated as code.
    """
    blocks = _PYTHON_BLOCK.findall(text)
    return blocks[-1].strip("\r\n") if blocks else None
