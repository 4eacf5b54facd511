"""Single-agent control: one generator call, on the workflows' generator request or on the raw dataset prompt."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Generate, Messages, problem_text, request_text
from .built_in import BuiltInWorkflow
from .formats import answer_format

TEMPLATES = ("generator", "raw")


@dataclass(kw_only=True, eq=False)
class SingleAgent(BuiltInWorkflow):
    """One ``generator`` call (instance 0); its output is the answer. The paper's SA-RL baseline.

    ``template="generator"`` (the research's): the call is the generator's first request of the multi-agent
    workflows (the prompt set's ``solve``), so the baseline differs from them only in the workflow.
    ``template="raw"``: the row's ``prompt`` is passed unchanged, so training through this workflow reproduces plain
    TRL GRPO on the same dataset exactly.

    Args:
        task: ``"math"`` or ``"code"``; selects the built-in prompts and the answer format.
        template: ``"generator"`` or ``"raw"``, as above.
        prompts: a prompt set (see ``EvalOpt``); ``template="generator"`` uses its ``solve``.
    """

    roles = ("generator",)

    template: str = "generator"

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"SingleAgent template must be one of {TEMPLATES}, got {self.template!r}.")
        super().__post_init__()

    @property
    def formats(self):
        return {"generator": answer_format(self.task)}

    async def run(self, prompt: Messages, generate: Generate) -> str:
        if self.template == "raw":
            return await generate("generator", prompt)
        request = self._prompts.render("solve", problem=problem_text(prompt), request=request_text(prompt))
        return await generate("generator", [{"role": "user", "content": request}])
