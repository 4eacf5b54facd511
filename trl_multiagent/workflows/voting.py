"""Voting: several generators answer independently and an aggregator picks one of their answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .base import Generate, Messages, problem_text, request_text
from .built_in import ReadWorkflow
from .formats import Selection, answer_format
from .reward_policy import OUTCOME, RoleRewardPolicy


@dataclass(kw_only=True, eq=False)
class Voting(ReadWorkflow):
    r"""Parallel voters, one selecting aggregator.

    ``n_voters`` ``generator`` calls run concurrently with instances ``0 .. n_voters - 1`` (one role type, so under
    isolated policies they share one adapter), then one ``aggregator`` call (instance 0) sees all answers, each under
    a numbered header, and picks one with ``\boxed{i}``; ``n_voters + 1`` calls per episode. The final answer is the
    chosen voter's output, verbatim; see ``parse_rules.parse_selection`` for the rule and its fallbacks.

    Args:
        n_voters: number of independent answers; the paper uses 3.
        task: ``"math"`` or ``"code"``; selects the built-in prompts and the answer format.
        prompts: a prompt set (see ``EvalOpt``); uses ``vote``, ``aggregate``, ``solution_block`` and
            ``solutions_separator``.
        parsing: how the choice is read (``parse_rules.parse_selection``): ``"reference"``, the first ``\boxed{N}``,
            else the first digit 1-9, else candidate 1; ``"robust"``, the last box in range, else the first digit in
            range.
    """

    roles = ("generator", "aggregator")

    n_voters: int = 3

    def __post_init__(self) -> None:
        if self.n_voters < 2:
            raise ValueError(
                f"Voting needs n_voters >= 2 to have a choice (got {self.n_voters}); for one answer use SingleAgent()."
            )
        super().__post_init__()

    @property
    def role_reward_policy(self) -> RoleRewardPolicy:
        # The reference's: its code Voting tests only the selected program and gives every role its result
        # (examples/deepcoder/deepcoder_voting_workflow.py:323-355); its math Voting grades each call on its own.
        return RoleRewardPolicy(dict.fromkeys(self.roles, OUTCOME) if self.task == "code" else {})

    @property
    def formats(self):
        return {"generator": answer_format(self.task), "aggregator": Selection(self.n_voters, self.parsing)}

    @property
    def parallel(self):
        return {"generator": self.n_voters}

    def group_key(self, role: str, instance: int) -> str:
        # The reference's grouping: it names its math voters generator0, 1, 2, a GRPO group each
        # (rllm/workflows/voting_workflow.py:214), and its code voters all generator, one group of every voter's
        # answers (examples/deepcoder/deepcoder_voting_workflow.py:245).
        return f"{role}{instance}" if role == "generator" and self.task == "math" else role

    async def run(self, prompt: Messages, generate: Generate) -> str:
        values = {"problem": problem_text(prompt), "request": request_text(prompt)}
        request = self._prompts.render("vote", **values)
        solutions = list(
            await asyncio.gather(
                *(
                    generate("generator", [{"role": "user", "content": request}], instance=i)
                    for i in range(self.n_voters)
                )
            )
        )
        blocks = self._prompts.solutions(solutions)
        ask = self._prompts.render("aggregate", **values, solutions=blocks, n=len(solutions))
        choice = await generate("aggregator", [{"role": "user", "content": ask}])
        return solutions[self.formats["aggregator"].read(choice)]
