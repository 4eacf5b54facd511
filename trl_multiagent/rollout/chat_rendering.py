"""How one model call's chat messages become prompt text and tokens, the same for every backend and for evaluation.

``"tokenizer"``: the tokenizer's own chat template with ``chat_template_kwargs`` (TRL's way). ``"reference_qwen"``:
the rendering of the research's reference stack (rLLM's Qwen chat parser with thinking disabled), which differs from
Qwen3's own template with ``enable_thinking=False`` in two ways that change what the model is trained on: every call
starts with Qwen's default system prompt unless its first message is a system message, and every assistant turn
(the earlier ones in the history as well as the generation prompt) opens with an empty think block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHAT_RENDERINGS = ("tokenizer", "reference_qwen")

# Qwen's default system prompt, which the reference puts before every call that does not start with its own.
QWEN_DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_START, _END = "<|im_start|>", "<|im_end|>"
_EMPTY_THINK = "<think>\n\n</think>\n\n"  # thinking off: the think block is there, and empty
_THINK_END = "</think>"


def check_chat_rendering(chat_rendering: str, chat_template_kwargs: Mapping[str, Any] | None) -> None:
    """Fail on an unknown rendering, or on chat-template arguments the reference rendering would silently drop."""
    if chat_rendering not in CHAT_RENDERINGS:
        raise ValueError(f"`chat_rendering` must be one of {CHAT_RENDERINGS}, got {chat_rendering!r}.")
    if chat_rendering == "reference_qwen" and dict(chat_template_kwargs or {}) not in ({}, {"enable_thinking": False}):
        raise ValueError(
            "chat_rendering='reference_qwen' renders without the tokenizer's chat template, always with thinking off, "
            f"so `chat_template_kwargs={dict(chat_template_kwargs)!r}` would be ignored: drop them (or keep only "
            "{'enable_thinking': False}), or set chat_rendering='tokenizer' to render with the chat template."
        )


class ChatRenderer:
    """Renders the messages of one call with the generation prompt; ``prompt_ids`` are what the model is given.

    A plain-text prompt (TRL's standard format) is not a chat: it is tokenized as it is, in either mode.
    """

    def __init__(
        self, tokenizer, chat_rendering: str = "tokenizer", chat_template_kwargs: Mapping[str, Any] | None = None
    ):
        check_chat_rendering(chat_rendering, chat_template_kwargs)
        if chat_rendering == "reference_qwen":
            vocabulary = tokenizer.get_vocab()
            missing = [token for token in (_START, _END) if token not in vocabulary]
            if missing:
                raise ValueError(
                    f"chat_rendering='reference_qwen' writes Qwen's chat markup, but the tokenizer of "
                    f"{getattr(tokenizer, 'name_or_path', None) or type(tokenizer).__name__!r} has no token "
                    f"{' or '.join(missing)}: it is not a Qwen chat tokenizer. Set chat_rendering='tokenizer' to "
                    "render with its own chat template."
                )
        self.tokenizer = tokenizer
        self.chat_rendering = chat_rendering
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def text(self, messages: list[dict[str, Any]]) -> str:
        """The prompt as text, ending with the generation prompt."""
        if self.chat_rendering == "tokenizer":
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        return _reference_qwen_text(messages)

    def prompt_ids(self, messages: list[dict[str, Any]] | str, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """``tools``: JSON schemas of the role's tools, rendered by the chat template (its tool format)."""
        if isinstance(messages, str):
            if tools:
                raise ValueError("A plain-text prompt has no chat template to describe tools in; use chat messages.")
            return self.tokenizer(text=messages)["input_ids"]
        if self.chat_rendering == "tokenizer":
            extra = {"tools": tools} if tools else {}  # only when given: the rendering without tools stays as it was
            return self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **extra,
                **self.chat_template_kwargs,
            )
        if tools:
            raise ValueError("chat_rendering='reference_qwen' renders no tools; use chat_rendering='tokenizer'.")
        # The reference tokenizes its rendered text with no special tokens added around it.
        return self.tokenizer.encode(self.text(messages), add_special_tokens=False)

    def prompt_ids_of(self, prompts: Sequence[tuple[list[dict[str, Any]] | str, list[dict[str, Any]] | None]]):
        """``prompt_ids(messages, tools)`` of each ``(messages, tools)``, each distinct prompt rendered once.

        A batch of calls repeats prompts (a role's parallel calls in an episode, the episodes of one problem), and
        with the tokenizer's chat template the distinct ones sharing their tools go through one batched
        ``apply_chat_template`` (one tokenizer call for all; the same ids as one at a time). Every prompt gets a list
        of its own.
        """
        distinct: dict[str, int] = {}  # repr of a prompt -> its position in `unique`
        unique, positions = [], []
        for prompt in prompts:
            key = repr(prompt)  # chat messages are plain data (what the template renders): equal reprs, equal prompts
            if key not in distinct:
                distinct[key] = len(unique)
                unique.append(prompt)
            positions.append(distinct[key])
        ids: list[list[int] | None] = [None] * len(unique)
        batches: dict[str, list[int]] = {}  # repr of the tools -> the chat prompts rendered together
        for i, (messages, tools) in enumerate(unique):
            if self.chat_rendering == "tokenizer" and not isinstance(messages, str):
                batches.setdefault(repr(tools), []).append(i)
            else:
                ids[i] = self.prompt_ids(messages, tools)
        for batch in batches.values():
            tools = unique[batch[0]][1]
            extra = {"tools": tools} if tools else {}  # as `prompt_ids`: the rendering without tools stays as it was
            rendered = self.tokenizer.apply_chat_template(
                [unique[i][0] for i in batch],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **extra,
                **self.chat_template_kwargs,
            )
            for i, prompt_ids in zip(batch, rendered):
                ids[i] = prompt_ids
        return [list(ids[position]) for position in positions]

    def completion_text(self, token_ids: list[int]) -> str:
        """What the workflow is handed for a completion (and what is graded and passed on to other roles).

        "tokenizer": the decoded text as it is. "reference_qwen": the reference parser's content with thinking off:
        the text after the ``</think>`` when there is exactly one, else the whole text, stripped of surrounding
        whitespace (so an answer starting with newlines reaches the next role's prompt without them).
        """
        return self._content(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def completion_texts(self, completions: Sequence[list[int]]) -> list[str]:
        """``completion_text`` of each completion, decoded in one tokenizer call."""
        if not completions:
            return []
        return [self._content(text) for text in self.tokenizer.batch_decode(completions, skip_special_tokens=True)]

    def _content(self, text: str) -> str:
        if self.chat_rendering == "tokenizer":
            return text
        if text.count(_THINK_END) == 1:
            text = text.partition(_THINK_END)[2]
        return text.strip()


def _reference_qwen_text(messages: list[dict[str, Any]]) -> str:
    if not messages:
        raise ValueError("A model call needs at least one message to render.")
    parts = []
    if messages[0].get("role") != "system":
        parts.append(_turn("system", QWEN_DEFAULT_SYSTEM_PROMPT))
    for message in messages:
        role = message.get("role")
        if message.get("tool_calls"):
            raise ValueError("chat_rendering='reference_qwen' renders no tool calls; use chat_rendering='tokenizer'.")
        if role in ("system", "user"):
            if not isinstance(message.get("content"), str):
                raise ValueError(
                    f"chat_rendering='reference_qwen' renders text content, got a {role} message {message!r}."
                )
            parts.append(_turn(role, message["content"]))
        elif role == "assistant":
            # Earlier answers are rendered from their content alone, stripped, behind an empty think block (any
            # separate reasoning is left out: the reference does not carry reasoning over from turn to turn).
            parts.append(_turn("assistant", _EMPTY_THINK + (message.get("content") or "").strip()))
        else:
            raise ValueError(
                f"chat_rendering='reference_qwen' renders system, user and assistant messages, got role {role!r}; "
                "use chat_rendering='tokenizer' for other roles."
            )
    parts.append(f"{_START}assistant\n{_EMPTY_THINK}")
    return "".join(parts)


def _turn(role: str, content: str) -> str:
    return f"{_START}{role}\n{content}{_END}\n"
