"""Voting: several generators answer independently and an aggregator picks one of their answers."""

from __future__ import annotations

import asyncio

from . import prompts
from .base import Generate, Messages, Workflow, problem_text
from .parsing import parse_selection


class Voting(Workflow):
    r"""Parallel voters, one selecting aggregator.

    ``n_voters`` ``generator`` calls run concurrently with instances ``0 .. n_voters - 1`` (one role type, so under
    isolated policies they share one adapter), then one ``aggregator`` call (instance 0) sees all answers as
    ``--- Solution i ---`` blocks and picks one with ``\boxed{i}``; ``n_voters + 1`` calls per episode. The final
    answer is the chosen voter's output, verbatim; see ``parse_selection`` for the fallbacks when the pick cannot
    be read.

    Args:
        n_voters: number of independent answers; the paper uses 3.
        task: ``"math"`` or ``"code"``; selects the role prompts.
    """

    roles = ("generator", "aggregator")

    def __init__(self, n_voters: int = 3, task: str = "math") -> None:
        if n_voters < 2:
            raise ValueError(
                f"Voting needs n_voters >= 2 to have a choice (got {n_voters}); for one answer use SingleAgent()."
            )
        self.n_voters = n_voters
        self.task = prompts.check_task(task)

    async def run(self, prompt: Messages, generate: Generate) -> str:
        problem = problem_text(prompt)
        request = prompts.solve(problem, self.task)
        solutions = await asyncio.gather(
            *(generate("generator", [{"role": "user", "content": request}], instance=i) for i in range(self.n_voters))
        )
        choice = await generate(
            "aggregator", [{"role": "user", "content": prompts.aggregate(problem, list(solutions), self.task)}]
        )
        index, _parsed = parse_selection(choice, len(solutions))
        return solutions[index]
