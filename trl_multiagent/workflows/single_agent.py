"""Single-agent control: one call on the dataset prompt, exactly what plain TRL GRPO generates."""

from __future__ import annotations

from .base import Generate, Messages, Workflow


class SingleAgent(Workflow):
    """One ``generator`` call (instance 0) on the row's ``prompt``, passed unchanged; its output is the answer.

    The prompt is not rewritten with the role prompts of the other workflows, so training through this workflow
    reproduces plain GRPO on the same dataset: the SA-RL baseline the paper compares every workflow against.
    """

    roles = ("generator",)

    async def run(self, prompt: Messages, generate: Generate) -> str:
        return await generate("generator", prompt)
