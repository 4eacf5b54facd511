"""Runs many workflow episodes concurrently and hands their model calls to the backend.

Every episode is an asyncio task running ``workflow.run``. Two ways to reach the backend:

    ticks  the engine lets all episodes advance until they wait on a model call, sends every pending call to the
           backend as one batch (one ``generate`` for all episodes, mixing adapters per sample), and hands each
           episode its result: no episode moves on before the whole batch has returned.
    async  each call goes to the backend (``agenerate``) the moment its episode makes it, and the episode resumes
           as soon as its own result arrives; the backend batches continuously (vLLM's scheduler), so a long
           completion holds up only its own episode.

Every call is recorded once, as a ``ModelCall`` on its episode, in the order the episode made its calls. An episode
that raises fails the whole rollout with an error naming it; every other episode and every request still in the
backend is cancelled first. With ``max_prompt_length``, a call whose prompt is longer is never sent: its episode ends
there (``PromptTooLongError`` is raised out of the workflow's ``generate``) and is returned ``dropped``, with no call
and no answer, as the reference stack ends such an episode and leaves it out of training.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..common.deprecation import moved_names
from ..workflows.base import Messages, Workflow
from .backends.base import GenerationBackend, GenerationRequest, GenerationResult, check_generation_kwargs
from .records import Episode, ModelCall, ToolConversation
from .tool_loop import RoleTools, tool_loop

# How many event-loop turns with no new model call count as "every episode is waiting on the backend". asyncio.gather
# needs a couple of turns to start its child tasks; extra turns only cost microseconds.
_QUIET_TURNS = 4


ROLLOUT_MODES = ("ticks", "async")


class UndeclaredRoleError(ValueError):
    pass


class PromptTooLongError(Exception):
    """A model call's prompt is over the engine's ``max_prompt_length``: raised out of ``generate`` to end the
    episode. The episode is dropped even if its workflow catches this and goes on."""


# `PromptTooLong`, this error's name before PEP 8's `Error` suffix, still works until it is removed (with a warning).
__getattr__ = moved_names(__name__)


class EpisodeError(RuntimeError):
    """An episode's workflow raised; ``episode`` is its index in the rollout batch."""

    def __init__(self, message: str, episode: int):
        super().__init__(message)
        self.episode = episode


class RolloutEngine:
    """Runs episodes of ``workflow`` through ``backend``; ``adapter_for_role`` routes each role type to an adapter.

    ``role_generation_kwargs`` (role type -> sampling settings, e.g. ``{"evaluator": {"temperature": 0.3,
    "max_tokens": 512, "stop": ["</verdict>"]}}``) rides on every request of that role, overriding the backend's
    settings for those calls only; keys are ``backends.base.GENERATION_KWARGS``. ``base_for_role`` (role type ->
    base model name), when roles sit on several base models, routes each call to (base, adapter).

    ``mode``: ``"ticks"`` (``backend.generate`` on each tick's batch) or ``"async"`` (``backend.agenerate`` per call,
    for backends that batch continuously).

    ``role_tools`` (role type -> ``RoleTools``): each ``generate`` of such a role runs its tool loop
    (``rollout.tool_loop``), one ``ModelCall`` per model call of the loop; required when the workflow declares
    ``tools`` (``{}`` runs those roles without them).

    ``max_prompt_length``: the most prompt tokens a call may have, measured by the backend's own rendering
    (``backend.prompt_ids(request)``, which the request then carries so that the backend does not render it again);
    a longer call ends its episode, which comes back ``dropped``. ``None``: no limit.
    """

    def __init__(
        self,
        workflow: Workflow,
        backend: GenerationBackend,
        adapter_for_role: Mapping[str, str],
        role_generation_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        mode: str = "ticks",
        base_for_role: Mapping[str, str] | None = None,
        role_tools: Mapping[str, RoleTools] | None = None,
        max_prompt_length: int | None = None,
    ):
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"Rollout mode must be one of {ROLLOUT_MODES}, got {mode!r}.")
        if mode == "async" and not hasattr(backend, "agenerate"):
            raise ValueError(
                f"{type(backend).__name__} batches per tick (it has no `agenerate`): use rollout_mode='ticks', or "
                "a backend that batches continuously (rollout_backend='vllm')."
            )
        missing = [role for role in workflow.roles if role not in adapter_for_role]
        if missing:
            raise ValueError(f"No adapter is routed for role(s) {missing} of {type(workflow).__name__}.")
        unknown = sorted(set(role_generation_kwargs or {}) - set(workflow.roles))
        if unknown:
            raise ValueError(
                f"`role_generation_kwargs` names role(s) {unknown}; {type(workflow).__name__}'s roles are "
                f"{list(workflow.roles)}."
            )
        if role_tools is None and workflow.tools:
            raise ValueError(
                f"{type(workflow).__name__} gives tools to role(s) {sorted(workflow.tools)}, and this engine was "
                "built without `role_tools`: pass role_tools=rollout.tool_loop.build_role_tools(...) (it needs each "
                "role's tokenizer to read tool calls), or role_tools={} to run the roles without their tools."
            )
        unknown = sorted(set(role_tools or {}) - set(workflow.roles))
        if unknown:
            raise ValueError(
                f"Tools are given to role(s) {unknown}; {type(workflow).__name__}'s roles are {workflow.roles}."
            )
        if max_prompt_length is not None and not hasattr(backend, "prompt_ids"):
            raise ValueError(
                f"max_prompt_length={max_prompt_length} measures each prompt before it is sent, and "
                f"{type(backend).__name__} has no `prompt_ids(request)` giving the token ids it would generate from: "
                "add one, or set max_prompt_length=None."
            )
        self.max_prompt_length = max_prompt_length
        self.role_tools = dict(role_tools or {})
        self.workflow = workflow
        self.backend = backend
        self.mode = mode
        self._runs = itertools.count()  # tells the episodes of successive runs apart (GenerationRequest.session)
        self.adapter_for_role = dict(adapter_for_role)
        missing = [role for role in workflow.roles if base_for_role is not None and role not in base_for_role]
        if missing:
            raise ValueError(f"No base model is routed for role(s) {missing} of {type(workflow).__name__}.")
        self.base_for_role = dict(base_for_role or {})
        self.role_generation_kwargs = {
            role: check_generation_kwargs(kwargs, f"role_generation_kwargs[{role!r}]")
            for role, kwargs in (role_generation_kwargs or {}).items()
        }

    def run(
        self,
        prompts: list[Messages],
        on_episode_end: Callable[[Episode], None] | None = None,
        *,
        episode_tools: Sequence[Mapping[str, RoleTools]] | None = None,
    ) -> list[Episode]:
        """One episode per prompt, in prompt order. ``on_episode_end(episode)``, if given, is called as each episode
        finishes, while the others still run (rewards that take work start there). ``episode_tools`` (one mapping
        per prompt, role type -> ``RoleTools``) replaces ``role_tools`` for those roles in that episode (tools bound
        to the episode's own environment, rollout/environments.py)."""
        if episode_tools is not None and len(episode_tools) != len(prompts):
            raise ValueError(f"`episode_tools` has {len(episode_tools)} entries for {len(prompts)} prompts.")
        # The episodes are filled in place and the main task returns nothing: on the main thread, asyncio.run formats
        # its main task, result included, when it restores the SIGINT handler, and formatting every episode's calls
        # cost more than the rest of the engine's own work (0.4 of its 0.9 ms for 8 single-call episodes).
        episodes = [Episode(index=i) for i in range(len(prompts))]
        if not _in_running_loop():
            asyncio.run(self._run_all(episodes, prompts, on_episode_end, episode_tools))
            return episodes
        # Called from inside a running loop (a notebook): run ours on a worker thread.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, self._run_all(episodes, prompts, on_episode_end, episode_tools)).result()
        return episodes

    async def _run_all(self, episodes: list[Episode], prompts: list[Messages], on_episode_end, episode_tools) -> None:
        loop = asyncio.get_running_loop()
        pending: list[tuple[GenerationRequest, asyncio.Future]] = []  # ticks: the calls waiting for the next batch
        run = next(self._runs)

        def make_generate(episode: Episode, made: list[tuple[int, ModelCall]], conversations: list):
            order = itertools.count()  # the order this episode made its calls (parallel ones finish in any order)
            loops = itertools.count()  # the order its `generate`s with tools began

            async def generate(role: str, messages: Messages, *, instance: int = 0) -> str:
                if role not in self.workflow.roles:
                    raise UndeclaredRoleError(
                        f"{type(self.workflow).__name__} called generate(role={role!r}) but declares roles "
                        f"{self.workflow.roles}. Add {role!r} to the workflow's `roles`."
                    )
                plain = isinstance(messages, str)  # TRL's standard format: text, no chat template
                if not plain and (not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)):
                    raise TypeError(
                        f"generate({role!r}, messages) needs a list of chat message dicts or a plain-text prompt, "
                        f"got {messages!r}"
                    )
                tools = self.role_tools.get(role)
                if episode_tools is not None and role in episode_tools[episode.index]:
                    tools = episode_tools[episode.index][role]
                if tools is None:
                    return (await call_model(role, messages, instance, None, 0))[0].text
                position = next(loops)
                conversation = await tool_loop(
                    lambda history, turn, left: call_model(role, history, instance, tools, turn, left), messages, tools
                )
                conversations.append((position, conversation))
                return conversation.text

            async def call_model(
                role: str, messages: Messages, instance: int, tools: RoleTools | None, turn: int, left=None
            ) -> tuple[GenerationResult, ModelCall]:
                adapter, position = self.adapter_for_role[role], next(order)
                settings = dict(self.role_generation_kwargs.get(role, {}))
                if left is not None:  # what is left of the role's tool-loop budget
                    settings["max_tokens"] = left
                base = self.base_for_role.get(role)
                schemas = tools.schemas if tools is not None else None
                request = GenerationRequest(
                    adapter, messages, settings, session=(id(self), run, episode.index), base=base, tools=schemas
                )
                if self.max_prompt_length is not None:
                    request.prompt_ids = self.backend.prompt_ids(request)
                    if len(request.prompt_ids) > self.max_prompt_length:
                        episode.dropped = True
                        raise PromptTooLongError(
                            f"a {role} call's prompt has {len(request.prompt_ids)} tokens, over max_prompt_length="
                            f"{self.max_prompt_length}"
                        )
                if self.mode == "async":
                    result: GenerationResult = await self.backend.agenerate(request)
                else:
                    future = loop.create_future()
                    pending.append((request, future))
                    result = await future
                call = ModelCall(
                    role=role,
                    instance=instance,
                    adapter=adapter,
                    messages=messages,
                    prompt_ids=result.prompt_ids,
                    completion_ids=result.completion_ids,
                    text=result.text,
                    truncated=result.truncated,
                    sampling_logprobs=result.sampling_logprobs,
                    base=base,
                    tools=schemas,
                    turn=turn,
                    provenance=result.provenance,
                )
                made.append((position, call))
                return result, call

            return generate

        async def run_episode(episode: Episode, prompt: Messages) -> None:
            made: list[tuple[int, ModelCall]] = []
            conversations: list[tuple[int, ToolConversation]] = []
            try:
                answer = await self.workflow.run(prompt, make_generate(episode, made, conversations))
            except PromptTooLongError:
                pass  # the refused call marked the episode dropped
            if episode.dropped:  # no call of it trains, those made before the refused one or beside it included
                if on_episode_end is not None:
                    on_episode_end(episode)
                return
            if not isinstance(answer, str):
                raise TypeError(
                    f"{type(self.workflow).__name__}.run must return the final answer as str, got {answer!r}"
                )
            episode.calls = [call for _, call in sorted(made, key=lambda item: item[0])]
            episode.tool_conversations = [c for _, c in sorted(conversations, key=lambda item: item[0])]
            episode.final_answer = answer
            if on_episode_end is not None:
                on_episode_end(episode)

        tasks = [asyncio.create_task(run_episode(e, p)) for e, p in zip(episodes, prompts)]
        try:
            if self.mode == "async":
                await self._run_async(tasks)
            else:
                await self._run_ticks(tasks, pending)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.mode == "async" and hasattr(self.backend, "drain"):
                self.backend.drain()  # every cancelled request has stopped in the backend too

    def _episode_error(self, tasks: list[asyncio.Task], failed: asyncio.Task) -> EpisodeError:
        index = tasks.index(failed)
        return EpisodeError(f"{type(self.workflow).__name__} failed in episode {index}: {failed.exception()}", index)

    async def _run_async(self, tasks: list[asyncio.Task]) -> None:
        running = set(tasks)
        while running:
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t for t in tasks if t in done and t.exception() is not None), None)
            if failed is not None:
                raise self._episode_error(tasks, failed) from failed.exception()

    async def _run_ticks(self, tasks: list[asyncio.Task], pending: list) -> None:
        while True:
            await self._wait_until_quiet(tasks, pending)
            failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
            if failed is not None:
                raise self._episode_error(tasks, failed) from failed.exception()
            if all(t.done() for t in tasks):
                return
            if not pending:  # episodes wait on something else (I/O, a sandbox): give it time
                await asyncio.sleep(0.001)
                continue
            batch = pending[:]
            pending.clear()
            results = self.backend.generate([request for request, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"Backend returned {len(results)} results for {len(batch)} requests.")
            for (_, future), result in zip(batch, results):
                future.set_result(result)

    @staticmethod
    async def _wait_until_quiet(tasks: list[asyncio.Task], pending: list) -> None:
        quiet, last = 0, (-1, -1)
        while quiet < _QUIET_TURNS:
            await asyncio.sleep(0)
            state = (len(pending), sum(t.done() for t in tasks))
            quiet = quiet + 1 if state == last else 0
            last = state


def _in_running_loop() -> bool:
    """Whether this thread runs an event loop now. Asked outside any ``except`` block, so that an error of the
    rollout that follows is not chained under the probe's "no running event loop"."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
