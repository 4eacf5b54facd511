"""Orch-Workers: an orchestrator plans strategies, workers solve with them, a synthesizer decides."""

from __future__ import annotations

import asyncio

from . import prompts
from .base import Generate, Messages, Workflow, problem_text
from .parsing import parse_strategies


class OrchWorkers(Workflow):
    r"""Orchestrator, parallel workers, synthesizer.

    One ``orchestrator`` call proposes up to ``n_workers`` different strategies as ``STRATEGY k: ...`` without
    solving; ``n_workers`` ``worker`` calls run concurrently with instances ``0 .. n_workers - 1``, worker ``i``
    using strategy ``i``; one ``synthesizer`` call compares the solutions and writes the final answer
    (``\boxed{}`` for math, a ```` ```python ```` block for code). ``n_workers + 2`` calls per episode. If fewer
    strategies can be parsed than there are workers, the rest get ``prompts.FALLBACK_STRATEGY`` (solve with the
    approach you judge most reliable), so every episode has the same shape.

    Args:
        n_workers: number of strategies and workers; the paper uses 3.
        task: ``"math"`` or ``"code"``; selects the role prompts.
    """

    roles = ("orchestrator", "worker", "synthesizer")

    def __init__(self, n_workers: int = 3, task: str = "math") -> None:
        if n_workers < 1:
            raise ValueError(f"OrchWorkers needs n_workers >= 1 (got {n_workers}); the paper uses 3.")
        self.n_workers = n_workers
        self.task = prompts.check_task(task)

    async def run(self, prompt: Messages, generate: Generate) -> str:
        problem = problem_text(prompt)
        plan = await generate(
            "orchestrator", [{"role": "user", "content": prompts.propose(problem, self.n_workers, self.task)}]
        )
        strategies = parse_strategies(plan, self.n_workers)
        strategies += [prompts.FALLBACK_STRATEGY] * (self.n_workers - len(strategies))
        solutions = await asyncio.gather(
            *(
                generate(
                    "worker", [{"role": "user", "content": prompts.work(problem, strategy, self.task)}], instance=i
                )
                for i, strategy in enumerate(strategies)
            )
        )
        return await generate(
            "synthesizer",
            [{"role": "user", "content": prompts.synthesize(problem, strategies, list(solutions), self.task)}],
        )
