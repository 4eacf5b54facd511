r"""What each role's output is, and the one rule that reads it.

A workflow declares ``formats``: role type -> output format. Each format says what the role's output means
(``kind``) and how it is read: ``parse(text)`` applies the primary rule and returns ``None`` when the output does not
follow it (the role's ``role/<role>/unparseable`` metric); ``read(text)`` is what the workflow acts on, after its
fallbacks. The workflow itself, the per-role metrics, the evaluation episodes and the toy evaluator all read role
outputs through these objects, so they cannot disagree.

Kinds, and what monitoring derives from them:

- ``"answer"``: a solution to the problem (graded against ground truth; parallel instances give pass@k);
- ``"verdict"``: a judgement of the latest answer before it in the episode (``True`` = correct);
- ``"selection"``: the 0-based index of the candidate answer it picks among the answers before it;
- ``"plan"``: a list of strategies for other roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ..common.parse_rules import (
    check_rule,
    last_boxed,
    last_code_block,
    parse_selection,
    parse_strategies,
    parse_verdict,
    read_strategies,
)

KINDS = ("answer", "verdict", "selection", "plan")


class OutputFormat(Protocol):
    kind: str  # one of KINDS

    def parse(self, text: str) -> Any | None:
        """The value under the primary rule; ``None`` when the output does not follow the format."""
        ...

    def read(self, text: str) -> Any:
        """The value the workflow acts on: ``parse`` with the format's fallbacks applied."""
        ...


@dataclass(frozen=True)
class BoxedAnswer:
    r"""A math answer: the last ``\boxed{}`` (``parse_rules.last_boxed``, what ``math_reward`` grades)."""

    kind: ClassVar[str] = "answer"

    def parse(self, text: str) -> str | None:
        return last_boxed(text)

    def read(self, text: str) -> str | None:
        return last_boxed(text)


@dataclass(frozen=True)
class CodeAnswer:
    """A program: the last python or untagged fenced block (``parse_rules.last_code_block``, what ``CodeReward``
    runs)."""

    kind: ClassVar[str] = "answer"

    def parse(self, text: str) -> str | None:
        return last_code_block(text)

    def read(self, text: str) -> str | None:
        return last_code_block(text)


@dataclass(frozen=True)
class Verdict:
    r"""``\boxed{Correct}`` / ``\boxed{Incorrect}`` (``parse_rules.parse_verdict`` under ``rule``, ``"robust"``: the
    last verdict box, or ``"reference"``: the first); no verdict reads as not satisfied."""

    rule: str = "robust"
    kind: ClassVar[str] = "verdict"

    def __post_init__(self) -> None:
        check_rule(self.rule)

    def parse(self, text: str) -> bool | None:
        return parse_verdict(text, self.rule)

    def read(self, text: str) -> bool:
        return parse_verdict(text, self.rule) is True


@dataclass(frozen=True)
class Selection:
    r"""The number of the chosen candidate among ``n_candidates``, as ``\boxed{i}`` (``parse_rules.parse_selection``).

    ``parse`` gives the 0-based index when a box holds a number in range; ``read`` falls back to the first digit
    (in range), then to candidate 0. ``rule``: which box and digit count (``"robust"``: the last box in range;
    ``"reference"``: the first box and the first digit, each tried once).
    """

    n_candidates: int
    rule: str = "robust"
    kind: ClassVar[str] = "selection"

    def __post_init__(self) -> None:
        check_rule(self.rule)

    def parse(self, text: str) -> int | None:
        index, parsed = parse_selection(text, self.n_candidates, self.rule)
        return index if parsed else None

    def read(self, text: str) -> int:
        return parse_selection(text, self.n_candidates, self.rule)[0]


@dataclass(frozen=True)
class Strategies:
    """Up to ``n`` strategies written as ``STRATEGY k: ...`` lines.

    ``require_all=False`` (Orch-Workers with one worker per strategy): the output follows the format when it has at
    least one ``STRATEGY k:`` header, and ``read`` falls back to a numbered list, the lines, then the whole text
    (``parse_rules.read_strategies``). ``require_all=True`` (a fixed worker count): it follows the format only with
    ``n`` headers, and ``read`` returns the parsed headers alone (the workflow fills the rest). ``rule``: the reader
    (``parse_rules.read_strategies``; ``"robust"``: order of appearance, markdown stripped, every non-empty line;
    ``"reference"``: the reference's, ordered by number, as written, lines over 10 characters).
    """

    n: int
    require_all: bool = False
    rule: str = "robust"
    kind: ClassVar[str] = "plan"

    def __post_init__(self) -> None:
        check_rule(self.rule)

    def parse(self, text: str) -> list[str] | None:
        strategies = parse_strategies(text, self.n, self.rule)
        enough = len(strategies) == self.n if self.require_all else bool(strategies)
        return strategies if enough else None

    def read(self, text: str) -> list[str]:
        if self.require_all:
            return parse_strategies(text, self.n, self.rule)
        return read_strategies(text, self.n, self.rule)


def answer_format(task: str) -> BoxedAnswer | CodeAnswer:
    """The answer format of a built-in task: boxed for ``"math"``, a python block for ``"code"``."""
    return CodeAnswer() if task == "code" else BoxedAnswer()


@dataclass(frozen=True)
class Reference:
    """What one call's output refers to among the calls before it in its episode (indices into the episode's calls)."""

    judged: int | None = None  # a verdict: the answer it judged
    candidates: tuple[int, ...] = ()  # a selection: the answers it chose among, by instance


def references(formats: dict[str, OutputFormat], calls: list) -> list[Reference]:
    """A verdict judges the latest answer before it; a selection chooses among the latest answer of each instance of
    the role that answered last before it. ``calls`` are the episode's records in call order (role, instance)."""
    found, latest, last = [], {}, None
    for i, call in enumerate(calls):
        kind = getattr(formats.get(call.role), "kind", None)
        if kind == "answer":
            latest[call.role, call.instance], last = i, i
            found.append(Reference())
        elif kind == "verdict":
            found.append(Reference(judged=last))
        elif kind == "selection" and last is not None:
            role = calls[last].role
            found.append(Reference(candidates=tuple(latest[key] for key in sorted(latest) if key[0] == role)))
        else:
            found.append(Reference())
    return found
