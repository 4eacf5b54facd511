"""Typed records that leave the rollout engine: one per model call, one per episode."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..workflows.base import Messages
from .backends.base import Provenance


@dataclass
class ModelCall:
    """One ``generate(role, messages)`` of a workflow: becomes exactly one training sample."""

    role: str  # role type, e.g. "generator"
    instance: int  # which parallel copy of the role (voter 0, 1, 2); 0 for sequential agents
    adapter: str  # the adapter that produced it (routing decides; "__base__" means no adapter)
    messages: Messages
    prompt_ids: list[int]  # chat-templated prompt, unpadded
    completion_ids: list[int]  # generated tokens up to and including the first EOS
    text: str  # decoded completion without special tokens
    truncated: bool  # stopped by the length limit, no EOS
    sampling_logprobs: list[float] | None = None  # one per completion token, from backends that report them
    base: str | None = None  # the base model it ran on when roles sit on several (`role_models`); None: the one base
    provenance: Provenance | None = None  # the adapter, version and backend that served it, as the backend stamped
    # Roles with tools (rollout/tool_loop.py): the tool schemas rendered into the prompt, the call's position in its
    # `generate`'s tool loop (0: the first call), and how many tool calls it made and how many of those failed.
    tools: list[dict] | None = None
    turn: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass
class ToolConversation:
    """One ``generate`` of a role with tools, whole: what TRL's ``GRPOTrainer(tools=...)`` calls a completion."""

    text: str  # what `generate` returned: the last call's text
    messages: list[dict]  # each call's parsed assistant message, then one `tool` message per tool call it made
    completion_ids: list[int]  # every token after the first call's prompt: completions and tool turns, in order


@dataclass
class Episode:
    """One run of a workflow on one prompt."""

    index: int  # position of its row in the generation batch
    calls: list[ModelCall] = field(default_factory=list)  # in the order the episode made them
    final_answer: str = ""
    tool_conversations: list[ToolConversation] = field(default_factory=list)  # in the order their `generate` began
    # Ended by a call whose prompt was over `max_prompt_length` (rollout/engine.py): no call, no answer, no training.
    dropped: bool = False

    def answering_conversation(self) -> ToolConversation | None:
        """The tool conversation whose text the workflow returned as its answer (the latest begun, if several)."""
        return next((c for c in reversed(self.tool_conversations) if c.text == self.final_answer), None)
