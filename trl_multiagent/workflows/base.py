"""The workflow contract: what roles say to each other, never how they are computed.

A workflow is a small object with the role types it uses and an async ``run`` that awaits
``generate(role, messages)`` as often as it likes and returns the final answer text. It never sees a
model, tokenizer, optimizer or logger: the rollout engine turns every ``generate`` call into a
training sample tagged with the role, the role instance and the episode.
"""

from __future__ import annotations

from typing import Any, Protocol

Messages = list[dict[str, Any]]  # chat messages: [{"role": "user", "content": "..."}]


class Generate(Protocol):
    """What a workflow awaits to get one model output.

    ``role`` must be one of the workflow's ``roles``. ``instance`` tells parallel copies of one role type
    apart (voter 0, 1, 2 share the ``generator`` role type); sequential calls of one agent keep instance 0.
    """

    async def __call__(self, role: str, messages: Messages, *, instance: int = 0) -> str: ...


class Workflow:
    """Base class of a multi-agent workflow.

    Subclasses set ``roles`` (the role types, each routed to an adapter by the trainer) and implement
    ``run``. ``run`` receives the dataset row's conversational ``prompt`` and returns the final answer,
    on which the outcome reward is computed with the trainer's ``reward_funcs``.
    """

    roles: tuple[str, ...] = ()

    async def run(self, prompt: Messages, generate: Generate) -> str:
        raise NotImplementedError

    def config_dict(self) -> dict[str, Any]:
        """The parameters that rebuild this workflow; saved next to checkpoints and in model cards."""
        params = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return {"workflow": type(self).__name__, **params}


def problem_text(prompt: Messages) -> str:
    """The problem statement of a conversational prompt: the content of its last user message."""
    for message in reversed(prompt):
        if message.get("role") == "user":
            content = message["content"]
            if isinstance(content, list):  # multimodal-style content parts
                return "".join(part.get("text", "") for part in content if part.get("type") == "text")
            return content
    raise ValueError(f"The prompt has no user message: {prompt!r}. Each row's `prompt` must end with a user turn.")
