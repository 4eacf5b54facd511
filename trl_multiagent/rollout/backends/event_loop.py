"""An event loop on a thread of its own, owned by an asynchronous backend.

vLLM's ``AsyncLLM`` and an ``httpx.AsyncClient`` bind to the event loop they first run on, while the rollout engine
runs each step's episodes in a fresh ``asyncio.run``. A backend keeps its clients on one long-lived loop and the
engine's episodes await work submitted to it (``call``), from any loop or thread.

Cancellation crosses the two loops: cancelling an awaiting ``call`` cancels the task on the backend's loop (vLLM then
aborts the request; httpx closes the connection, which makes a vLLM server abort it), and ``drain`` returns once every
task has really stopped, so nothing keeps running after a failed rollout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .base import RendersPrompts

if TYPE_CHECKING:
    from .base import GenerationRequest, GenerationResult


class BackgroundLoop:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine) -> Any:
        """Run ``coro`` on the backend's loop and block until it returns (for synchronous callers)."""
        return self._submit(coro).result()

    async def call(self, coro: Coroutine) -> Any:
        """Await ``coro`` running on the backend's loop; cancelling this await cancels it there."""
        return await asyncio.wrap_future(self._submit(coro))

    def run_all(self, coros: list[Coroutine]) -> list[Any]:
        """Run ``coros`` concurrently on the backend's loop and block until all return; when one fails, the others
        are cancelled (and have stopped) before its error is raised."""

        async def all_of_them() -> list[Any]:
            tasks = [asyncio.ensure_future(coro) for coro in coros]
            try:
                return list(await asyncio.gather(*tasks))
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        return self.run(all_of_them())

    def in_flight(self) -> int:
        """Tasks started on the backend's loop that have not finished yet."""
        return len(self._tasks)

    def drain(self, timeout: float = 60.0) -> None:
        """Block until every task submitted so far has finished or been cancelled (cancellations that were requested
        before this call have been delivered: both travel through the loop's FIFO of thread-safe callbacks)."""

        async def wait_all() -> None:
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(wait_all(), self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()

    def _submit(self, coro: Coroutine) -> concurrent.futures.Future:
        # Like asyncio.run_coroutine_threadsafe, but the task is registered the moment it is created (before it
        # first runs), so `drain` also waits for tasks cancelled before they started.
        outer: concurrent.futures.Future = concurrent.futures.Future()

        def start() -> None:
            if outer.cancelled():
                coro.close()
                return
            task = self.loop.create_task(coro)
            self._tasks.add(task)

            def finish(task: asyncio.Task) -> None:
                self._tasks.discard(task)
                try:
                    if task.cancelled():
                        outer.cancel()
                    elif task.exception() is not None:
                        outer.set_exception(task.exception())
                    else:
                        outer.set_result(task.result())
                except concurrent.futures.InvalidStateError:  # the caller cancelled first
                    pass

            task.add_done_callback(finish)
            outer.add_done_callback(lambda f: f.cancelled() and self.loop.call_soon_threadsafe(task.cancel))

        self.loop.call_soon_threadsafe(start)
        return outer


class LoopCalls(RendersPrompts):
    """``agenerate``, ``generate`` and ``drain`` of a backend that answers each request with the coroutine
    ``_complete(request, prompt_ids)`` on its own ``BackgroundLoop`` (``self._loop``): vLLM's ``AsyncLLM``, vLLM
    servers. The backend also holds ``folders`` (``AdapterFolders``: the adapters it serves), or its own
    ``check_synced``, and ``renderer`` (``ChatRenderer``: the prompts' token ids, ``RendersPrompts``)."""

    def check_synced(self, adapters) -> None:
        """Fail unless every adapter in ``adapters`` was sent to vLLM."""
        self.folders.check_synced(adapters)

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        self.check_synced([request.adapter])
        return await self._loop.call(self._complete(request, self.prompt_ids(request)))

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.check_synced([r.adapter for r in requests])
        prompts = self.prompt_ids_of(requests)
        return self._loop.run_all([self._complete(r, p) for r, p in zip(requests, prompts)])

    def drain(self, timeout: float = 60.0) -> None:
        self._loop.drain(timeout)
