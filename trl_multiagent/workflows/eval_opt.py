"""Eval-Opt: a generator answers, an evaluator judges, and the generator retries until judged correct."""

from __future__ import annotations

from . import prompts
from .base import Generate, Messages, Workflow, problem_text
from .parsing import parse_verdict


class EvalOpt(Workflow):
    r"""Evaluator-optimizer loop.

    Each iteration is one ``generator`` call followed by exactly one ``evaluator`` call; the loop stops at a
    ``\boxed{Correct}`` verdict or after ``max_iterations`` generator calls, so an episode makes 2 to
    ``2 * max_iterations`` calls, all with instance 0. An unparseable verdict counts as not satisfied. The final
    answer is the last generator output (the evaluator's last verdict does not veto it).

    Args:
        max_iterations: most generator attempts per episode; the paper uses 3 for math and 2 for code.
        task: ``"math"`` or ``"code"``; selects the role prompts.
    """

    roles = ("generator", "evaluator")

    def __init__(self, max_iterations: int = 3, task: str = "math") -> None:
        if max_iterations < 1:
            raise ValueError(
                f"EvalOpt needs max_iterations >= 1 (got {max_iterations}); the paper uses 3 for math, 2 for code."
            )
        self.max_iterations = max_iterations
        self.task = prompts.check_task(task)

    async def run(self, prompt: Messages, generate: Generate) -> str:
        problem = problem_text(prompt)
        request = {"role": "user", "content": prompts.solve(problem, self.task)}
        messages = [request]
        for _ in range(self.max_iterations):
            solution = await generate("generator", messages)
            # A fresh conversation per review: the evaluator judges the current attempt on its own merits.
            review = await generate(
                "evaluator", [{"role": "user", "content": prompts.evaluate(problem, solution, self.task)}]
            )
            if parse_verdict(review) is True:
                break
            # Only the latest attempt and its critique are kept, so the generator's prompt stays bounded in length
            # however many iterations run.
            messages = [
                request,
                {"role": "assistant", "content": solution},
                {"role": "user", "content": prompts.refine(review, self.task)},
            ]
        return solution
