r"""Reading structured answers out of model text: boxed answers, code, verdicts, selections, strategies.

Pure functions, no model, in neither the workflows nor the tasks so that both read them (``import re`` only: the
workflows stay importable without torch). One rule per question, used everywhere it is asked: by the workflows
(``workflows/formats.py`` binds them to roles), by the rewards (``tasks.math.extract_boxed`` and
``tasks.code.extract_code`` are these functions), by the per-role metrics and by the evaluators. Small models under RL
often drift from the requested format, so the workflow-facing readers have documented fallbacks instead of raising.

Shared conventions:

- Only the text after the last ``</think>`` is read (a reasoning model's answer follows its thinking).
- Boxes are ``\boxed{...}`` or ``\fbox{...}`` with nested braces matched, or ``\boxed 5`` (the next token).
- When several candidates appear, the **last** one counts: the last box for an answer, the last code block.

The judges' readers (verdict, selection, strategies) have two rules, named by ``rule``:

- ``"reference"`` (the paper preset, and the workflows' default): the research's reference workflows' readers. The
  first ``\boxed{Correct}`` / ``\boxed{Incorrect}`` written exactly so (any case); the first ``\boxed{N}`` of
  digits, else the first standalone digit 1-9, else candidate 1, each tried once; ``STRATEGY k:`` headers and
  numbered items in the order of their numbers, kept as written (markdown included); strategy lines longer than 10
  characters.
- ``"robust"`` (the toy preset, which the shipped toy model was trained and measured with): LaTeX-tolerant boxes
  (``\fbox``, ``\boxed{\text{Correct.}}``, ``\boxed{Solution 2}``) and the **last** verdict or in-range selection
  box, so a judge that changes its mind is read by its final word and a judge that restates a candidate's answer
  (``Solution 1 says \boxed{3}``) before choosing is read by its choice; the first digit in range; every non-empty
  strategy line; strategies in order of appearance, without markdown bullets.
"""

from __future__ import annotations

import re

__all__ = [
    "RULES",
    "answer_part",
    "check_rule",
    "last_boxed",
    "last_code_block",
    "parse_selection",
    "parse_strategies",
    "parse_verdict",
    "read_strategies",
]

_THINK_END = "</think>"
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_BARE_ARGUMENT = re.compile(r"[^\s$]+")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_SELECTION = re.compile(r"(?:solution|candidate)?\s*#?\s*(\d+)\s*\.?", re.IGNORECASE)
_BARE_DIGIT = re.compile(r"\b([1-9])\b")
# The reference's readers: a verdict or selection box is its literal form, nothing inside but the word or the digits.
_REFERENCE_VERDICT = re.compile(r"\\boxed\{(correct|incorrect)\}", re.IGNORECASE)
_REFERENCE_SELECTION = re.compile(r"\\boxed\{(\d+)\}", re.IGNORECASE)
_REFERENCE_LINE_FLOOR = 10  # a fallback strategy line must be longer than this, once stripped of blanks
RULES = ("reference", "robust")
_STRATEGY_HEADER = re.compile(r"STRATEGY\s*\d+\s*\**\s*:", re.IGNORECASE)
_NUMBERED_ITEM = re.compile(r"^[ \t]*\**\d+[.)]\**[ \t]+", re.MULTILINE)
_MARKDOWN_DECORATION = " \t\r\n*#->"  # bold markers, headings and bullets around a strategy
# The reference's orchestrator reader. A strategy runs from its ``STRATEGY k:`` header (no markdown inside it) to the
# next such header or the end of the text; a numbered item from a line starting ``k.`` or ``k)`` to the next line that
# starts so or the end. Neither strips markdown, and each list is put in the order of its numbers.
_REFERENCE_HEADER = r"STRATEGY\s*\d+\s*:"
_REFERENCE_STRATEGY = re.compile(
    rf"STRATEGY\s*(?P<number>\d+)\s*:\s*(?P<text>.+?)(?={_REFERENCE_HEADER}|$)", re.IGNORECASE | re.DOTALL
)
_REFERENCE_ITEM = re.compile(r"^\s*(?P<number>\d+)[.)]\s*(?P<text>.+?)(?=^\s*\d+[.)]|\Z)", re.MULTILINE | re.DOTALL)
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


def check_rule(rule: str) -> str:
    """Return ``rule`` if it names a judges' reading rule, else raise a ``ValueError`` naming them."""
    if rule not in RULES:
        raise ValueError(f"Unknown parsing rule {rule!r}; use one of {RULES} (see trl_multiagent.common.parse_rules).")
    return rule


def parse_verdict(text: str, rule: str = "robust") -> bool | None:
    r"""An evaluator's verdict: ``True`` for ``\boxed{Correct}``, ``False`` for ``\boxed{Incorrect}``.

    ``rule="robust"``: case-insensitive; LaTeX wrappers and punctuation inside the box are ignored
    (``\boxed{\text{correct.}}``). The last verdict box wins; boxes holding anything else, such as a restated answer
    ``\boxed{42}``, are skipped. ``rule="reference"``: the first ``\boxed{Correct}`` or ``\boxed{Incorrect}``
    written exactly so, in any case; any other box is no verdict.
    ``None`` when no box holds a verdict; Eval-Opt treats that as "not satisfied" and retries.
    """
    text = answer_part(text)
    if check_rule(rule) == "reference":
        match = _REFERENCE_VERDICT.search(text)
        return match.group(1).lower() == "correct" if match else None
    for content in reversed(_boxes(text)):
        if content is not None:
            word = _plain(content).strip(".!").lower()
            if word in ("correct", "incorrect"):
                return word == "correct"
    return None


def parse_selection(text: str, n_candidates: int, rule: str = "robust") -> tuple[int, bool]:
    r"""The 0-based index of the candidate an aggregator picked, and whether the primary rule read it.

    ``rule="robust"``: primary, the last box holding a number ``1 <= i <= n_candidates`` (``\boxed{Solution 2}``
    too), giving ``(i - 1, True)``; fallbacks, with ``False``: the first standalone digit 1-9 that is at most
    ``n_candidates``; otherwise candidate 0. ``rule="reference"``: the first ``\boxed{N}`` of digits, if ``N`` is in
    range; else the first standalone digit 1-9, if in range; else candidate 0. Each is tried once: an out-of-range
    first box or digit is not followed by a later one.
    """
    if n_candidates < 1:
        raise ValueError(f"parse_selection needs at least one candidate, got n_candidates={n_candidates}.")
    text = answer_part(text)
    if check_rule(rule) == "reference":
        box = _REFERENCE_SELECTION.search(text)
        if box and 1 <= int(box.group(1)) <= n_candidates:
            return int(box.group(1)) - 1, True
        digit = _BARE_DIGIT.search(text)
        return (int(digit.group(1)) - 1 if digit and int(digit.group(1)) <= n_candidates else 0), False
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


def _by_number(pattern: re.Pattern, text: str) -> list[str]:
    """The ``text`` group of every match, stripped of blanks, ordered by the ``number`` group (ties: as written)."""
    found = [(int(match["number"]), match["text"].strip()) for match in pattern.finditer(text)]
    return [strategy for _, strategy in sorted(found, key=lambda item: item[0])]


def parse_strategies(text: str, n: int, rule: str = "robust") -> list[str]:
    """The strategies an orchestrator proposed as ``STRATEGY k: ...``, at most ``n``.

    A strategy runs from its header to the next header (or the end), so it may span lines; headers are
    case-insensitive. ``rule="robust"``: in order of appearance; headers may carry markdown (``**Strategy 2:**``,
    ``- STRATEGY 2:``), which is stripped from the strategy, and empty strategies are dropped. ``rule="reference"``:
    the reference's reader, ordered by ``k`` and kept as written (markdown included, ``**STRATEGY 1:** x`` gives
    ``** x``); the header is ``STRATEGY k:`` exactly (``**Strategy 1**:`` is none), and a strategy holds at least one
    character, so a header with nothing after it swallows the next header (``STRATEGY 1:\nSTRATEGY 2: x`` gives
    ``STRATEGY 2: x``). An empty list when there is no header: see ``read_strategies`` for the fallbacks.
    """
    text = answer_part(text)
    if check_rule(rule) == "reference":
        return _by_number(_REFERENCE_STRATEGY, text)[:n]
    return _split_at(list(_STRATEGY_HEADER.finditer(text)), text)[:n]


def read_strategies(text: str, n: int, rule: str = "robust") -> list[str]:
    """Between 1 and ``n`` strategies from an orchestrator's output, with the reference workflow's fallbacks.

    In order, the first rule that finds any: ``STRATEGY k:`` headers (``parse_strategies``); a numbered list
    (``1.`` or ``1)`` at a line start, each item up to the next); the lines; the whole text (possibly empty). At
    most ``n`` are kept. ``rule="robust"``: strategies in order of appearance without markdown decoration; numbered
    items need a blank after the number; every non-empty line counts. ``rule="reference"``: the reference's reader
    (examples/math_reasoning/orchestrator_workers_math_workflow.py, ``parse_proposals``): headers and numbered
    items ordered by their numbers and kept as written, markdown included; the lines longer than 10 characters once
    stripped of blanks; the first ``n`` of the list found.
    """
    text = answer_part(text)
    if check_rule(rule) == "reference":
        lines = [line.strip() for line in text.split("\n") if len(line.strip()) > _REFERENCE_LINE_FLOOR]
        found = (parse_strategies(text, n, rule), _by_number(_REFERENCE_ITEM, text), lines)
    else:
        lines = [line.strip(_MARKDOWN_DECORATION) for line in text.splitlines() if line.strip(_MARKDOWN_DECORATION)]
        found = (parse_strategies(text, n), _split_at(list(_NUMBERED_ITEM.finditer(text)), text), lines)
    for strategies in found:
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
