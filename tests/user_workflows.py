"""A user's workflow, as a user writes one in their own importable module: none of its roles has a built-in name.

``DraftCritic``: a drafter answers, a critic judges the draft (a declared verdict), and the drafter rewrites while
the critic says Incorrect, at most ``rewrites`` times. Tests import it as ``user_workflows:DraftCritic``.
"""

from __future__ import annotations

from trl_multiagent.workflows import BoxedAnswer, Verdict, Workflow, problem_text


class DraftCritic(Workflow):
    roles = ("drafter", "critic")
    formats = {"drafter": BoxedAnswer(), "critic": Verdict("robust")}

    def __init__(self, rewrites: int = 1) -> None:
        self.rewrites = rewrites

    async def run(self, prompt, generate) -> str:
        ask = [{"role": "user", "content": f"{problem_text(prompt)}\nPut the final answer in \\boxed{{}}."}]
        draft = await generate("drafter", ask)
        for _ in range(self.rewrites):
            review = [{"role": "user", "content": f"{problem_text(prompt)}\nAnswer: {draft}\nCorrect or Incorrect?"}]
            if self.formats["critic"].read(await generate("critic", review)):
                break
            draft = await generate("drafter", [*ask, {"role": "assistant", "content": draft}])
        return draft
