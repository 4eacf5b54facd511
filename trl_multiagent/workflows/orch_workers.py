"""Orch-Workers: an orchestrator plans strategies, workers solve with them, a synthesizer decides."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .base import Generate, Messages, problem_text, request_text
from .built_in import ReadWorkflow
from .formats import Strategies, answer_format
from .reward_policy import ZERO, RoleRewardPolicy

WORKER_COUNTS = ("per_strategy", "fixed")


@dataclass(kw_only=True, eq=False)
class OrchWorkers(ReadWorkflow):
    r"""Orchestrator, parallel workers, synthesizer.

    One ``orchestrator`` call proposes at most ``n_workers`` different strategies as ``STRATEGY k: ...`` without
    solving; then ``worker`` calls run concurrently with instances ``0, 1, ...``, worker ``i`` using strategy ``i``;
    one ``synthesizer`` call sees every solution under a header naming its strategy and writes the final answer
    (``\boxed{}`` for math, a ```` ```python ```` block for code).

    ``workers="per_strategy"`` (the research's): one worker per strategy read, 1 to ``n_workers``, with the reference
    fallbacks when there is no ``STRATEGY k:`` header: a numbered list, then the lines, then the whole text
    (``parse_rules.read_strategies``); ``2 + (1 .. n_workers)`` calls per episode. ``workers="fixed"``: always
    ``n_workers`` workers; those left without a parsed strategy get the prompt set's ``fallback_strategy``, so
    every episode has the same shape.

    Args:
        n_workers: most strategies and workers; the paper uses 3.
        task: ``"math"`` or ``"code"``; selects the built-in prompts and the answer format.
        workers: ``"per_strategy"`` or ``"fixed"``, as above.
        prompts: a prompt set (see ``EvalOpt``); uses ``propose``, ``work``, ``synthesize``,
            ``strategy_solution_block``, ``solutions_separator`` and ``fallback_strategy``.
        parsing: how the plan is read (``parse_rules.read_strategies``): ``"reference"``, the reference's reader
            (``STRATEGY k:`` headers and numbered items ordered by ``k`` and kept as written, the lines longer than
            10 characters); ``"robust"``, in order of appearance without markdown decoration, every non-empty line.
    """

    roles = ("orchestrator", "worker", "synthesizer")
    # The reference's per-role rewards: the orchestrator's and the workers' are 0, the synthesizer's its own answer,
    # the episode's final answer (rllm/workflows/orchestrator_workers_workflow.py:290-332).
    role_reward_policy = RoleRewardPolicy({"orchestrator": ZERO, "worker": ZERO})

    n_workers: int = 3
    workers: str = "per_strategy"

    def __post_init__(self) -> None:
        if self.n_workers < 1:
            raise ValueError(f"OrchWorkers needs n_workers >= 1 (got {self.n_workers}); the paper uses 3.")
        if self.workers not in WORKER_COUNTS:
            raise ValueError(f"OrchWorkers workers must be one of {WORKER_COUNTS}, got {self.workers!r}.")
        super().__post_init__()

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
