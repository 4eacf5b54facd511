"""Which role outputs are right, read off the roles' declared formats (``Workflow.formats``).

Given which answers of an episode are right (graded against the row's ground truth by the caller), every other
call's correctness follows from what its role's output means: a verdict is right when it matches the answer it
judged, a selection when the answer it picked is right; a plan has no correctness of its own. Monitoring's per-role
metrics, the per-role rewards and the evaluators all grade roles through ``grade_calls``, so they cannot disagree
on what "right" is; each decides which calls it counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .formats import OutputFormat, references

SOLVED = 1.0  # the reward of a right answer: math_reward and CodeReward give 1.0 for right, less otherwise


def solved(reward: float | None) -> bool:
    """Whether an outcome reward says the answer is right: at least ``SOLVED`` (None, NaN: not right)."""
    return reward is not None and reward >= SOLVED


@dataclass(frozen=True)
class Grade:
    """Whether one call's output is right, and the answers it chose among."""

    right: bool | None  # None: nothing to grade (a plan, a role without a format, a verdict with no answer before it)
    # A selection, or an answer written after another role's answers (a synthesizer): whether each of those answers
    # (the latest of each instance) is right, by instance.
    candidates: tuple[bool, ...] = ()


def grade_calls(
    formats: Mapping[str, OutputFormat],
    calls: Sequence[Any],
    answer_right: Mapping[int, bool],
    strict_verdicts: bool = False,
) -> list[Grade]:
    """The ``Grade`` of each of an episode's ``calls`` (its records in call order).

    ``answer_right``: call index -> whether that answer is right, for every call of an ``"answer"`` role.
    ``strict_verdicts``: a verdict that does not follow its format (``parse`` is None) is wrong; otherwise it is
    read as the workflow acts on it (``read``: no verdict means Incorrect, as Eval-Opt reads it to go on).
    """
    grades, latest, last = [], {}, None  # latest answer per (role, instance); the last answer so far
    for i, (call, ref) in enumerate(zip(calls, references(formats, calls))):
        fmt = formats.get(call.role)
        kind = getattr(fmt, "kind", None)
        if kind == "answer":
            merged = last is not None and calls[last].role != call.role
            candidates = _latest_of(latest, calls[last].role, answer_right) if merged else ()
            grades.append(Grade(answer_right[i], candidates))
            latest[call.role, call.instance], last = i, i
        elif kind == "verdict" and ref.judged is not None:
            verdict = fmt.parse(call.text) if strict_verdicts else fmt.read(call.text)
            grades.append(Grade(verdict == answer_right[ref.judged]))
        elif kind == "selection" and ref.candidates:
            pick = ref.candidates[min(fmt.read(call.text), len(ref.candidates) - 1)]
            grades.append(Grade(answer_right[pick], tuple(answer_right[k] for k in ref.candidates)))
        else:
            grades.append(Grade(None))
    return grades


def _latest_of(latest: dict, role: str, answer_right: Mapping[int, bool]) -> tuple[bool, ...]:
    return tuple(answer_right[latest[key]] for key in sorted(latest) if key[0] == role)
