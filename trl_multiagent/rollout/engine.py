"""Runs many workflow episodes concurrently and batches their model calls.

Every episode is an asyncio task running ``workflow.run``. Each tick, the engine lets all episodes advance until
they wait on a model call, sends every pending call to the backend as one batch (one ``generate`` for all
episodes, mixing adapters per sample), and hands each episode its result. Every call is recorded as a
``ModelCall`` on its episode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Any

from ..workflows.base import Messages, Workflow
from .backends.base import GenerationBackend, GenerationRequest, GenerationResult, check_generation_kwargs
from .records import Episode, ModelCall

# How many event-loop turns with no new model call count as "every episode is waiting on the backend". asyncio.gather
# needs a couple of turns to start its child tasks; extra turns only cost microseconds.
_QUIET_TURNS = 4


class UndeclaredRoleError(ValueError):
    pass


class RolloutEngine:
    """Runs episodes of ``workflow`` through ``backend``; ``adapter_for_role`` routes each role type to an adapter.

    ``role_generation_kwargs`` (role type -> sampling settings, e.g. ``{"evaluator": {"temperature": 0.3,
    "max_tokens": 512, "stop": ["</verdict>"]}}``) rides on every request of that role, overriding the backend's
    settings for those calls only; keys are ``backends.base.GENERATION_KWARGS``. ``base_for_role`` (role type ->
    base model name), when roles sit on several base models, routes each call to (base, adapter).
    """

    def __init__(
        self,
        workflow: Workflow,
        backend: GenerationBackend,
        adapter_for_role: Mapping[str, str],
        role_generation_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        base_for_role: Mapping[str, str] | None = None,
    ):
        missing = [role for role in workflow.roles if role not in adapter_for_role]
        if missing:
            raise ValueError(f"No adapter is routed for role(s) {missing} of {type(workflow).__name__}.")
        unknown = sorted(set(role_generation_kwargs or {}) - set(workflow.roles))
        if unknown:
            raise ValueError(
                f"`role_generation_kwargs` names role(s) {unknown}; {type(workflow).__name__}'s roles are "
                f"{list(workflow.roles)}."
            )
        self.workflow = workflow
        self.backend = backend
        self.adapter_for_role = dict(adapter_for_role)
        missing = [role for role in workflow.roles if base_for_role is not None and role not in base_for_role]
        if missing:
            raise ValueError(f"No base model is routed for role(s) {missing} of {type(workflow).__name__}.")
        self.base_for_role = dict(base_for_role or {})
        self.role_generation_kwargs = {
            role: check_generation_kwargs(kwargs, f"role_generation_kwargs[{role!r}]")
            for role, kwargs in (role_generation_kwargs or {}).items()
        }

    def run(self, prompts: list[Messages]) -> list[Episode]:
        """One episode per prompt, in prompt order."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._run_all(prompts))
        # Called from inside a running loop (a notebook): run ours on a worker thread.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, self._run_all(prompts)).result()

    async def _run_all(self, prompts: list[Messages]) -> list[Episode]:
        loop = asyncio.get_running_loop()
        pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        episodes = [Episode(index=i) for i in range(len(prompts))]

        def make_generate(episode: Episode):
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
                adapter = self.adapter_for_role[role]
                future = loop.create_future()
                settings = dict(self.role_generation_kwargs.get(role, {}))
                base = self.base_for_role.get(role)
                pending.append((GenerationRequest(adapter, messages, settings, base), future))
                result: GenerationResult = await future
                episode.calls.append(
                    ModelCall(
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
                    )
                )
                return result.text

            return generate

        async def run_episode(episode: Episode, prompt: Messages) -> None:
            answer = await self.workflow.run(prompt, make_generate(episode))
            if not isinstance(answer, str):
                raise TypeError(
                    f"{type(self.workflow).__name__}.run must return the final answer as str, got {answer!r}"
                )
            episode.final_answer = answer

        tasks = [asyncio.create_task(run_episode(e, p)) for e, p in zip(episodes, prompts)]
        try:
            while True:
                await self._wait_until_quiet(tasks, pending)
                failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
                if failed is not None:
                    index = tasks.index(failed)
                    raise RuntimeError(
                        f"{type(self.workflow).__name__} failed in episode {index}: {failed.exception()}"
                    ) from failed.exception()
                if all(t.done() for t in tasks):
                    break
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
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return episodes

    @staticmethod
    async def _wait_until_quiet(tasks: list[asyncio.Task], pending: list) -> None:
        quiet, last = 0, (-1, -1)
        while quiet < _QUIET_TURNS:
            await asyncio.sleep(0)
            state = (len(pending), sum(t.done() for t in tasks))
            quiet = quiet + 1 if state == last else 0
            last = state
