"""A role's tool loop: the model calls Python functions between turns of one ``generate(role, messages)``.

One ``generate`` of a role with tools runs, as TRL's ``GRPOTrainer(tools=...)`` does for its one completion:

    1. the model is called on the messages, rendered with the role's tool schemas (the chat template's tool format);
    2. its completion is read with the chat template's response parser (TRL's ``parse_response``); no tool call: its
       text is the role's answer and the loop ends;
    3. each tool call runs (sync tools on a worker thread, so other episodes keep going; each under a timeout); an
       unknown tool, bad arguments, an exception or a timeout becomes a tool turn holding the error, never a crash;
    4. the assistant turn and one ``tool`` message per call are appended, and the model is called again (step 1),
       at most ``max_iterations`` rounds of tools; the turns since the first prompt (completions and tool outputs)
       hold at most ``max_tokens`` tokens: a round of tool outputs that would pass it is dropped and ends the loop
       (its tool calls still count), and each call after a round may generate only what is left of the budget.

Every model call is one training sample of the role: its prompt holds the earlier turns and the tool outputs, so tool
outputs are only ever prompt tokens (masked from the loss). Workflows only declare tools; this module, in the rollout
package, runs them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..workflows.base import Messages, Workflow
from .backends.base import GenerationResult
from .records import ModelCall, ToolConversation

# (messages, turn, max_tokens) -> the backend's result and the call's record; the engine makes and records the call.
# max_tokens: None for the role's own setting, else what is left of the loop's budget.
CallModel = Callable[[Messages, int, int | None], Awaitable[tuple[GenerationResult, ModelCall]]]


@dataclass
class RoleTools:
    """One role's tools and how its completions are read.

    ``functions``: tool name -> the function (sync or async); ``schemas``: their JSON schemas, rendered into every
    prompt of the role; ``parse(prompt_ids, completion_ids) -> message``: the assistant message of a completion, with
    ``tool_calls`` when it calls tools; ``prompt_ids(messages)``: the prompt the backend is given for ``messages``
    (the chat template with the tools), to measure a round of tool outputs before the call; ``max_iterations``: most
    rounds of tools per ``generate`` (None: no cap); ``max_tokens``: the loop's token budget; ``timeout``: seconds one
    tool call may take.
    """

    functions: dict[str, Callable[..., Any]]
    schemas: list[dict[str, Any]]
    parse: Callable[[list[int], list[int]], dict[str, Any]]
    prompt_ids: Callable[[Messages], list[int]]
    max_iterations: int | None
    max_tokens: int
    timeout: float


def tool_schemas(functions: Sequence[Callable[..., Any]], where: str) -> dict[str, dict[str, Any]]:
    """Tool name -> JSON schema, from each function's signature, type hints and docstring (transformers'
    ``get_json_schema``, what ``apply_chat_template(tools=...)`` renders)."""
    from ..seams.transformers import get_json_schema

    schemas: dict[str, dict[str, Any]] = {}
    for function in functions:
        if not callable(function):
            raise TypeError(f"{where} must list callables (Python functions), got {function!r}.")
        try:
            schema = get_json_schema(function)
        except Exception as error:  # transformers raises its own DocstringParsingException / TypeHintParsingException
            raise ValueError(
                f"{where}: {getattr(function, '__name__', function)!r} cannot be described to the model ({error}). "
                "A tool needs type hints on every argument and a Google-style docstring with an `Args:` section."
            ) from error
        name = schema["function"]["name"]
        if name in schemas:
            raise ValueError(f"{where} has two tools named {name!r}; tool names must be unique per role.")
        schemas[name] = schema
    return schemas


def response_parser(
    tokenizer, schemas: list[dict[str, Any]], where: str
) -> Callable[[list[int], list[int]], dict[str, Any]]:
    """``parse(prompt_ids, completion_ids)`` reading tool calls the chat template's way, as TRL's GRPOTrainer does.

    ``schemas`` type the arguments (``"7"`` is 7 for an integer parameter). Fails now when the tokenizer's chat
    template cannot render a tool conversation, or has no known response format.
    """
    from trl import add_response_schema, supports_tool_calling

    from ..seams.trl import parse_response

    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    if not supports_tool_calling(tokenizer):
        raise ValueError(
            f"{where}: the chat template of {name!r} cannot render a tool conversation (user -> assistant with "
            "tool_calls -> tool). Use a tool-calling chat template (e.g. Qwen3's) or a model trained for tools."
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)  # raises, naming the fix, for a chat template TRL does not know

    def parse(prompt_ids: list[int], completion_ids: list[int]) -> dict[str, Any]:
        if not completion_ids:
            return {}
        return parse_response(tokenizer, completion_ids, prefix=prompt_ids, tools=schemas)

    return parse


async def tool_loop(call_model: CallModel, messages: Messages, tools: RoleTools) -> ToolConversation:
    """Run one ``generate`` of a role with tools (steps in the module docstring). Returns the conversation it added:
    its text is the last call's, its messages and token ids what TRL's ``GRPOTrainer(tools=...)`` hands its reward
    functions as the completion (each completion parsed, the tool turns after it; an empty completion adds no message)
    and its ``completion_ids`` (the tokens after the first prompt, tool turns included)."""
    history = list(messages)
    added: list[dict[str, Any]] = []
    start: int | None = None
    turn, left = 0, None
    while True:
        result, call = await call_model(history, turn, left)  # 1.
        start = len(result.prompt_ids) if start is None else start
        message = tools.parse(result.prompt_ids, result.completion_ids)  # 2.
        if message or turn == 0:
            added.append(message)
        requested = message.get("tool_calls") or []
        if not requested or (tools.max_iterations is not None and turn >= tools.max_iterations):
            break
        outputs = await asyncio.gather(*(run_tool_call(tools, request) for request in requested))  # 3.
        call.tool_calls = len(outputs)
        call.tool_errors = sum(failed for _, failed in outputs)
        tool_turns = [output for output, _ in outputs]
        following = [*history, message, *tool_turns]  # 4.
        following_ids = tools.prompt_ids(following)
        left = tools.max_tokens - (len(following_ids) - start)
        if left < 0:
            break
        history = following
        added += tool_turns
        turn += 1
        if left == 0:  # the tool outputs fill the budget: there is nothing left to generate
            return ToolConversation(text=result.text, messages=added, completion_ids=following_ids[start:])
    # Past the first prompt: the earlier completions and tool turns, as the chat template renders them.
    completion_ids = [*result.prompt_ids[start:], *result.completion_ids]
    return ToolConversation(text=result.text, messages=added, completion_ids=completion_ids)


async def run_tool_call(tools: RoleTools, request: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """One tool call as a ``tool`` message, and whether it failed (its content is then ``{'error': ...}``)."""
    function = request.get("function") if request.get("type", "function") == "function" else None
    name = str((function or {}).get("name", request.get("name", "unknown")))
    try:
        if function is None:
            raise ValueError(f"Unsupported tool call type: {request.get('type')!r}.")
        tool = tools.functions.get(name)
        if tool is None:
            raise ValueError(f"Tool {name!r} not found; the tools are {sorted(tools.functions)}.")
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):  # some templates leave the arguments as JSON text
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f"Tool arguments must be a JSON object, got {arguments!r}.")
        if inspect.iscoroutinefunction(tool):
            output = await asyncio.wait_for(tool(**arguments), tools.timeout)
        else:
            # A thread, so the other episodes run meanwhile; a sync tool that times out is left to finish there.
            output = await asyncio.wait_for(asyncio.to_thread(tool, **arguments), tools.timeout)
    except TimeoutError:
        return _tool_message(name, {"error": f"Tool {name!r} timed out after {tools.timeout:g}s."}), True
    except Exception as error:
        return _tool_message(name, {"error": str(error) or type(error).__name__}), True
    return _tool_message(name, output), False


def _tool_message(name: str, output: Any) -> dict[str, Any]:
    return {"role": "tool", "name": name, "content": str(output)}


class ToolSettings(Protocol):
    """What bounds the tool loops of a run: the training config's fields of these names, which the evaluation's
    settings take from it."""

    max_completion_length: int | None  # a role's tokens, unless its `role_generation_kwargs` set `max_tokens`
    role_generation_kwargs: Mapping[str, Mapping[str, Any]] | None
    chat_template_kwargs: Mapping[str, Any] | None  # as the backends render prompts
    max_tool_calling_iterations: int | None
    tool_timeout: float


def build_role_tools(
    workflow: Workflow,
    settings: ToolSettings,
    tokenizer_for_role: Callable[[str], Any],
    *,
    tools: Sequence[Callable[..., Any]] | None = None,
    role_tools: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
) -> dict[str, RoleTools]:
    """Role type -> its ``RoleTools``, for the roles of ``workflow`` that have any: its declared ``tools``, then
    ``role_tools[role]``, then ``tools`` (given to every role), bounded by ``settings`` as training and evaluation
    run them; each role's tool calls read with ``tokenizer_for_role(role)``."""
    from .chat_rendering import ChatRenderer

    roles, declared = workflow.roles, workflow.tools
    for where, mapping in (("`role_tools`", role_tools), ("The workflow's `tools`", declared)):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise TypeError(f"{where} must map role types to lists of functions, got {mapping!r}.")
        unknown = sorted(set(mapping or {}) - set(roles))
        if unknown:
            raise ValueError(f"{where} names role(s) {unknown}; the workflow's roles are {list(roles)}.")
    max_iterations = settings.max_tool_calling_iterations
    if max_iterations is not None and max_iterations < 0:
        raise ValueError(f"`max_tool_calling_iterations` must be >= 0 or None, got {max_iterations}.")
    role_kwargs = settings.role_generation_kwargs or {}
    built = {}
    for role in roles:
        functions = [*(declared or {}).get(role, ()), *(role_tools or {}).get(role, ()), *(tools or ())]
        if not functions:
            continue
        schemas = tool_schemas(functions, f"The tools of role {role!r}")
        by_name = dict(zip(schemas, functions))
        listed = list(schemas.values())
        tokenizer = tokenizer_for_role(role)
        renderer = ChatRenderer(tokenizer, chat_template_kwargs=settings.chat_template_kwargs)
        built[role] = RoleTools(
            functions=by_name,
            schemas=listed,
            parse=response_parser(tokenizer, listed, f"The tools of role {role!r}"),
            prompt_ids=lambda messages, renderer=renderer, listed=listed: renderer.prompt_ids(messages, listed),
            max_iterations=max_iterations,
            max_tokens=role_kwargs.get(role, {}).get("max_tokens", settings.max_completion_length),
            timeout=settings.tool_timeout,
        )
    return built
