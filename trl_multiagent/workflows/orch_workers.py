"""Orch-Workers: an orchestrator plans strategies, workers solve with them, a synthesizer decides."""

from __future__ import annotations

import asyncio
from typing import Any

from ..parse_rules import check_rule
from . import prompts as prompt_sets
from .base import Generate, Messages, Workflow, problem_text, request_text
from .formats import Strategies, answer_format
from .prompt_set import PromptSet
from .reward_policy import ZERO, RoleRewardPolicy

WORKER_COUNTS = ("per_strategy", "fixed")


class OrchWorkers(Workflow):
    r"""Orchestrator, parallel workers, synthesizer.

    One ``orchestrator`` call proposes at most ``n_workers`` different strategies as ``STRATEGY k: ...`` without
    solving; then ``worker`` calls run concurrently with instances ``0, 1, ...``, worker ``i`` using strategy ``i``;
    one ``synthesizer`` call sees every solution under a header naming its strategy and writes the final answer
    (``\boxed{}`` for math, a ```` ```python ```` block for code).

    ``workers="per_strategy"`` (the research's): one worker per strategy read, 1 to ``n_workers``, with the reference
    fallbacks when there is no ``STRATEGY k:`` header: a numbered list, then the lines, then the whole text
    (``parsing.read_strategies``); ``2 + (1 .. n_workers)`` calls per episode. ``workers="fixed"``: always
    ``n_workers`` workers; those left without a parsed strategy get the prompt set's ``fallback_strategy``, so
    every episode has the same shape.

    Args:
        n_workers: most strategies and workers; the paper uses 3.
        task: ``"math"`` or ``"code"``; selects the built-in prompts and the answer format.
        workers: ``"per_strategy"`` or ``"fixed"``, as above.
        prompts: a prompt set (see ``EvalOpt``); uses ``propose``, ``work``, ``synthesize``,
            ``strategy_solution_block``, ``solutions_separator`` and ``fallback_strategy``.
        parsing: how the plan is read (``parsing.read_strategies``): ``"reference"``, the reference's reader
            (``STRATEGY k:`` headers and numbered items ordered by ``k`` and kept as written, the lines longer than
            10 characters); ``"robust"``, in order of appearance without markdown decoration, every non-empty line.
    """

    roles = ("orchestrator", "worker", "synthesizer")
    # The reference's per-role rewards: the orchestrator's and the workers' are 0, the synthesizer's its own answer,
    # the episode's final answer (rllm/workflows/orchestrator_workers_workflow.py:290-332).
    role_reward_policy = RoleRewardPolicy({"orchestrator": ZERO, "worker": ZERO})

    def __init__(
        self,
        n_workers: int = 3,
        task: str = "math",
        workers: str = "per_strategy",
        prompts: str | dict[str, Any] | PromptSet = "paper",
        parsing: str = "reference",
    ) -> None:
        if n_workers < 1:
            raise ValueError(f"OrchWorkers needs n_workers >= 1 (got {n_workers}); the paper uses 3.")
        if workers not in WORKER_COUNTS:
            raise ValueError(f"OrchWorkers workers must be one of {WORKER_COUNTS}, got {workers!r}.")
        self.n_workers = n_workers
        self.task = prompt_sets.check_task(task)
        self.workers = workers
        self.parsing = check_rule(parsing)
        self._prompts, self.prompts = prompt_sets.resolve(prompts, task)

    @property
    def formats(self):
        return {
            "orchestrator": Strategies(self.n_workers, require_all=self.workers == "fixed", rule=self.parsing),
            "worker": answer_format(self.task),
            "synthesizer": answer_format(self.task),
        }

    @property
    def parallel(self):
        return {"worker": self.n_workers}

    async def run(self, prompt: Messages, generate: Generate) -> str:
        values = {"problem": problem_text(prompt), "request": request_text(prompt)}
        strategy_format = "\n".join(f"STRATEGY {k}: <strategy>" for k in range(1, self.n_workers + 1))
        ask = self._prompts.render("propose", **values, max_subtasks=self.n_workers, strategy_format=strategy_format)
        plan = await generate("orchestrator", [{"role": "user", "content": ask}])
        strategies = self.formats["orchestrator"].read(plan)
        if self.workers == "fixed":
            strategies += [self._prompts.fallback_strategy] * (self.n_workers - len(strategies))
        solutions = await asyncio.gather(
            *(
                generate(
                    "worker",
                    [{"role": "user", "content": self._prompts.render("work", **values, strategy=strategy)}],
                    instance=i,
                )
                for i, strategy in enumerate(strategies)
            )
        )
        blocks = self._prompts.solutions(list(solutions), strategies)
        ask = self._prompts.render("synthesize", **values, solutions=blocks, n=len(solutions))
        return await generate("synthesizer", [{"role": "user", "content": ask}])
