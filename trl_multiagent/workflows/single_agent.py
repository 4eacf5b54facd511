"""Single-agent control: one generator call, on the workflows' generator request or on the raw dataset prompt."""

from __future__ import annotations

from typing import Any

from . import prompts as prompt_sets
from .base import Generate, Messages, Workflow, problem_text, request_text
from .formats import answer_format
from .prompt_set import PromptSet

TEMPLATES = ("generator", "raw")


class SingleAgent(Workflow):
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

    def __init__(
        self, task: str = "math", template: str = "generator", prompts: str | dict[str, Any] | PromptSet = "paper"
    ) -> None:
        if template not in TEMPLATES:
            raise ValueError(f"SingleAgent template must be one of {TEMPLATES}, got {template!r}.")
        self.task = prompt_sets.check_task(task)
        self.template = template
        self._prompts, self.prompts = prompt_sets.resolve(prompts, task)

    @property
    def formats(self):
        return {"generator": answer_format(self.task)}

    async def run(self, prompt: Messages, generate: Generate) -> str:
        if self.template == "raw":
            return await generate("generator", prompt)
        request = self._prompts.render("solve", problem=problem_text(prompt), request=request_text(prompt))
        return await generate("generator", [{"role": "user", "content": request}])
