r"""Evaluator verdicts on code judged against test outcomes: was ``\boxed{Correct}`` said of a program that passes?

In an Eval-Opt episode evaluator call ``i`` judges generator call ``i``. Running each judged program on the row's
tests tells whether its verdict was right, which is what monitoring logs as the evaluator's verdict accuracy on
code (the paper's "the evaluator learns when to retry").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..common.parse_rules import check_rule, parse_verdict
from .code import extract_code
from .sandbox import Outcome, SandboxPool, TestSuite, run_tests


@dataclass(frozen=True)
class VerdictCheck:
    """One evaluator verdict next to the test outcome of the program it judged."""

    said_correct: bool | None  # parse_verdict of the evaluator's text; None: no verdict box
    passed: bool  # the judged program passed every test (no ```python block: it did not)

    @property
    def right(self) -> bool:
        """Correct iff the program passes; no verdict counts as Incorrect, as Eval-Opt treats it (it retries)."""
        return (self.said_correct is True) == self.passed


def check_verdicts(
    verdicts: Sequence[str],
    solutions: Sequence[str],
    tests: str,
    pool: SandboxPool | None = None,
    rule: str = "robust",
) -> list[VerdictCheck]:
    """Judge an Eval-Opt episode's evaluator verdicts against the tests of the row.

    ``verdicts[i]`` is the evaluator's output on the generator output ``solutions[i]``; ``tests`` is the row's
    ``tests`` column (``TestSuite`` JSON). Each program is graded like ``CodeReward(mode="all_pass")``: its last
    ```python block, stopping at the first failing test. Give a ``pool`` to grade in parallel (and reuse its
    workers); without one the programs run one after another. ``rule`` reads the verdicts as the workflow did
    (``EvalOpt(parsing=...)``; see ``parsing.parse_verdict``).
    """
    check_rule(rule)
    if len(verdicts) != len(solutions):
        raise ValueError(
            f"Got {len(verdicts)} verdicts for {len(solutions)} solutions; pass the generator output each evaluator "
            "call judged (Eval-Opt pairs generator call i with evaluator call i)."
        )
    suite = TestSuite.from_json(tests)
    sources = [extract_code(solution) for solution in solutions]
    graded = [i for i, source in enumerate(sources) if source is not None]
    problems = [(sources[i], suite) for i in graded]
    reports = pool.run(problems) if pool is not None else [run_tests(source, suite) for source, suite in problems]
    passed = [False] * len(sources)
    for i, report in zip(graded, reports, strict=True):
        passed[i] = report.outcome is Outcome.PASSED
    return [VerdictCheck(parse_verdict(text, rule), ok) for text, ok in zip(verdicts, passed, strict=True)]
