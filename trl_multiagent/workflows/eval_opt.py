"""Eval-Opt: a generator answers, an evaluator judges, and the generator retries until judged correct."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Generate, Messages, problem_text, request_text
from .built_in import ReadWorkflow
from .formats import Verdict, answer_format
from .prompt_set import uses
from .reward_policy import OUTCOME, RoleRewardPolicy

HISTORIES = ("shared", "fresh")


@dataclass(kw_only=True, eq=False)
class EvalOpt(ReadWorkflow):
    r"""Evaluator-optimizer loop.

    Each iteration is one ``generator`` call followed by exactly one ``evaluator`` call; the loop stops at a
    ``\boxed{Correct}`` verdict or after ``max_iterations`` generator calls, so an episode makes 2 to
    ``2 * max_iterations`` calls, all with instance 0. An unparseable verdict counts as not satisfied. The final
    answer is the last generator output (the evaluator's last verdict does not veto it).

    ``history="shared"`` (the research's): one conversation holding the first request and then every output,
    attempts and critiques alike, as assistant turns (so two assistant turns in a row). Each call sees it whole with
    its own request as a last user turn; the evaluate and refine requests are shown only to the call they ask, and
    not kept::

        generator:  [U solve]
        evaluator:  [U solve, A attempt 1, U evaluate]
        generator:  [U solve, A attempt 1, A critique 1, U refine]
        evaluator:  [U solve, A attempt 1, A critique 1, A attempt 2, U evaluate]
        generator:  [U solve, A attempt 1, A critique 1, A attempt 2, A critique 2, U refine]

    ``history="fresh"``: the evaluator gets a new single-message chat holding the problem and the attempt
    (``{solution}`` in its template), and the generator sees its first request, its latest attempt and a
    refinement request quoting the critique (``{feedback}``), so prompts stay bounded in length.

    Args:
        max_iterations: most generator attempts per episode; the paper uses 3 for math and 2 for code.
        task: ``"math"`` or ``"code"``; selects the built-in prompts and the answer format.
        history: ``"shared"`` or ``"fresh"``, as above.
        parsing: how the verdict is read (``parse_rules.parse_verdict``): ``"reference"``, the first verdict box
            written exactly ``\boxed{Correct}`` or ``\boxed{Incorrect}``; ``"robust"``, the last, LaTeX wrappers
            allowed.
        prompts: a prompt set: ``"paper"``, ``"guarded"``, a JSON file in the reference's ``prompt.json`` layout, or a
            ``PromptSet`` (see ``prompt_set.py``). Uses ``solve``, ``evaluate`` and ``refine``.
    """

    roles = ("generator", "evaluator")

    max_iterations: int = 3
    history: str = "shared"

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise ValueError(
                f"EvalOpt needs max_iterations >= 1 (got {self.max_iterations}); the paper uses 3 for math, 2 for "
                "code."
            )
        if self.history not in HISTORIES:
            raise ValueError(f"EvalOpt history must be one of {HISTORIES}, got {self.history!r}.")
        super().__post_init__()
        if self.history == "fresh":
            for name, variable in (("evaluate", "solution"), ("refine", "feedback")):
                if not uses(getattr(self._prompts, name), variable):
                    raise ValueError(
                        f"EvalOpt(history='fresh') shows the {'attempt' if variable == 'solution' else 'critique'} "
                        f"only through the {name!r} template's {{{variable}}}, which this prompt set's lacks (it is "
                        "written for the shared conversation). Use history='shared', prompts='guarded', or a "
                        f"prompt set whose {name!r} template has {{{variable}}}."
                    )

    @property
    def role_reward_policy(self) -> RoleRewardPolicy:
        # The reference's: its code Eval-Opt tests only the final program, so every attempt is rewarded, and every
        # verdict judged, by that program's result (examples/deepcoder/deepcoder_evaluator_optimizer_workflow.py:
        # 423-442); its math Eval-Opt grades each call on its own.
        return RoleRewardPolicy(dict.fromkeys(self.roles, OUTCOME) if self.task == "code" else {})

    @property
    def formats(self):
        return {"generator": answer_format(self.task), "evaluator": Verdict(self.parsing)}

    def review_request(self, prompt: Messages, solution: str) -> Messages:
        """The messages of an episode's first ``evaluator`` call, given the ``generator``'s first attempt
        ``solution``: what this workflow's evaluator judges in every episode (for a judge of other answers, e.g.
        the judged best-of-n baseline, ``evaluation/judged.py``)."""
        values = {"problem": problem_text(prompt), "request": request_text(prompt)}
        ask = {"role": "user", "content": self._prompts.render("evaluate", **values, solution=solution)}
        if self.history == "fresh":
            return [ask]
        request = {"role": "user", "content": self._prompts.render("solve", **values)}
        return [request, {"role": "assistant", "content": solution}, ask]

    async def run(self, prompt: Messages, generate: Generate) -> str:
        values = {"problem": problem_text(prompt), "request": request_text(prompt)}
        request = {"role": "user", "content": self._prompts.render("solve", **values)}
        if self.history == "shared":
            return await self._run_shared(request, values, generate)
        return await self._run_fresh(request, values, generate)

    async def _run_shared(self, request: dict, values: dict[str, str], generate: Generate) -> str:
        # Every call gets a new list, so each recorded call keeps exactly the messages it was given.
        verdict = self.formats["evaluator"]
        conversation = [request]
        solution = await generate("generator", conversation)
        for iteration in range(self.max_iterations):
            conversation = [*conversation, {"role": "assistant", "content": solution}]
            ask = {"role": "user", "content": self._prompts.render("evaluate", **values, solution=solution)}
            review = await generate("evaluator", [*conversation, ask])
            conversation = [*conversation, {"role": "assistant", "content": review}]
            if verdict.read(review) or iteration == self.max_iterations - 1:
                break
            refine = {"role": "user", "content": self._prompts.render("refine", feedback=review)}
            solution = await generate("generator", [*conversation, refine])
        return solution

    async def _run_fresh(self, request: dict, values: dict[str, str], generate: Generate) -> str:
        verdict = self.formats["evaluator"]
        messages = [request]
        for _ in range(self.max_iterations):
            solution = await generate("generator", messages)
            ask = self._prompts.render("evaluate", **values, solution=solution)
            review = await generate("evaluator", [{"role": "user", "content": ask}])
            if verdict.read(review):
                break
            messages = [
                request,
                {"role": "assistant", "content": solution},
                {"role": "user", "content": self._prompts.render("refine", feedback=review)},
            ]
        return solution
