"""The vLLM server client: waits for the servers, retries while they start, says how to start one when it can't,
balances calls over several servers (an episode's calls on one), loads adapters into each, and fails a stalled request
on its timeout naming the server, leaving nothing running.

Stand-in HTTP servers on 127.0.0.1 play vLLM's routes; no vLLM needed.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time
from collections import Counter

import pytest
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.vllm_server import ServerError, VLLMServerBackend
from trl_multiagent.rollout.engine import EpisodeError, RolloutEngine


class FakeVLLM(http.server.BaseHTTPRequestHandler):
    """Answers 503 to the first ``failures[route]`` requests of a route (a server still starting), then 200 (400 for
    /v1/bad). ``/v1/completions`` answers one token (id 7) after ``delay`` seconds (with ``stall``: once the test
    releases it), and records what it was sent and how many it answered."""

    protocol_version = "HTTP/1.1"

    def _reply(self, code: int, body: bytes = b"{}") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, body: dict | None) -> None:
        server = self.server
        server.seen[self.path] += 1
        if server.seen[self.path] <= server.failures[self.path]:
            self._reply(503)
        elif self.path == "/v1/bad":
            self._reply(400, b'{"message": "adapter already loaded"}')
        elif self.path == "/v1/completions":
            server.bodies.append(body)
            server.running += 1
            try:
                if server.stall:
                    server.release.wait(60)  # released at teardown; the bound only keeps a broken test from hanging
                else:
                    time.sleep(server.delay)
            finally:
                server.running -= 1
            choice = {"index": 0, "token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}
            self._reply(200, json.dumps({"model": body["model"], "choices": [choice]}).encode())
            server.answered += 1
        else:
            self._reply(200)

    def do_GET(self):
        self._answer(None)

    def do_POST(self):
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def log_message(self, *args):
        pass


def start_fake(failures: dict | None = None, delay: float = 0.0, stall: bool = False):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    server.daemon_threads = True
    server.failures, server.seen, server.bodies = Counter(failures or {}), Counter(), []
    server.delay, server.running, server.answered = delay, 0, 0
    server.stall, server.release = stall, threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def fakes():
    started = []

    def make(**kwargs):
        started.append(start_fake(**kwargs))
        return started[-1]

    yield make
    for server, _ in started:
        server.release.set()
        server.shutdown()
        server.server_close()


class Tok:
    """The few tokenizer calls the client makes."""

    def apply_chat_template(self, messages, **kwargs):
        if messages and isinstance(messages[0], list):  # a batch of conversations, as transformers takes them
            return [self.apply_chat_template(conversation, **kwargs) for conversation in messages]
        return [1, 2, len(messages)]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def client(urls, timeout: float = 30.0, **kwargs) -> VLLMServerBackend:
    return VLLMServerBackend(
        urls, Tok(), ["generator", "evaluator"], {"max_tokens": 4}, [0], timeout=timeout, **kwargs
    )


def synced(backend: VLLMServerBackend) -> VLLMServerBackend:
    backend.follow_sync()  # the names another process loaded the adapters under
    return backend


def test_waits_for_health_and_retries_while_the_server_starts(fakes):
    server, url = fakes(failures={"/health": 2, "/v1/load_lora_adapter": 2})
    backend = client(url)  # /health: 503, 503, then 200
    assert server.seen["/health"] == 3
    assert backend.post(url, "/v1/load_lora_adapter", {"lora_name": "generator", "lora_path": "/x"}) == {}
    assert server.seen["/v1/load_lora_adapter"] == 3  # two 503s retried with backoff
    with pytest.raises(RuntimeError, match="failed \\(400\\).*already loaded"):
        backend.post(url, "/v1/bad", {})  # a client error is not retried
    assert server.seen["/v1/bad"] == 1


def test_no_server_fails_naming_the_url_and_the_serve_command():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RuntimeError) as error:
        client(f"http://127.0.0.1:{port}", timeout=1.0)
    message = str(error.value)
    assert f"http://127.0.0.1:{port}/health" in message
    assert "vllm serve <base model> --enable-lora --max-loras 3" in message  # 2 role adapters + the base slot
    assert "trl-multiagent vllm-serve" in message


def test_calls_spread_over_servers_and_an_episode_stays_on_one(fakes):
    (one, url_one), (two, url_two) = fakes(delay=0.05), fakes(delay=0.05)
    backend = synced(client([url_one, url_two]))
    engine = RolloutEngine(
        EvalOpt(max_iterations=2), backend, {"generator": "generator", "evaluator": "evaluator"}, mode="async"
    )
    episodes = engine.run([[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(8)])
    calls = sum(len(e.calls) for e in episodes)
    assert calls == 8 * 4  # generator, evaluator (unparseable verdict: continue), generator, evaluator
    assert len(one.bodies) + len(two.bodies) == calls and len(one.bodies) == len(two.bodies) == calls // 2
    # each episode's calls all went to one server (its growing conversation is in that server's prefix cache)
    by_episode = {session[-1]: url for session, url in backend._sessions.items()}
    assert len(by_episode) == 8 and set(by_episode.values()) == {url_one, url_two}
    assert len(one.bodies) == 4 * sum(url == url_one for url in by_episode.values())
    names = {backend.served.name_of("generator"), backend.served.name_of("evaluator")}
    assert all(body["model"] in names and body["logprobs"] == 0 for body in one.bodies)


def test_concurrency_is_bounded_per_server(fakes):
    server, url = fakes(delay=0.1)
    backend = synced(client(url, max_concurrency=3))
    peak = []

    async def watch():
        for _ in range(20):
            peak.append(server.running)
            await asyncio.sleep(0.02)

    requests = [GenerationRequest("generator", [{"role": "user", "content": str(i)}]) for i in range(9)]
    threading.Thread(target=lambda: asyncio.run(watch()), daemon=True).start()
    results = backend.generate(requests)
    assert len(results) == 9 and all(r.completion_ids == [7] for r in results)
    assert max(peak) == 3


def test_a_stalled_server_fails_the_rollout_naming_it_and_nothing_keeps_running(fakes):
    server, url = fakes(stall=True)
    backend = synced(client(url, request_timeout=0.5))
    engine = RolloutEngine(EvalOpt(), backend, {"generator": "generator", "evaluator": "evaluator"}, mode="async")
    with pytest.raises(
        EpisodeError, match=f"failed in episode \\d: vLLM server {url} did not answer /v1/completions within 0.5 s"
    ) as error:
        engine.run([[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(4)])
    assert isinstance(error.value.__cause__, ServerError) and "vllm_request_timeout" in str(error.value)
    assert server.answered == 0  # it failed on its own timeout while the server still held every request
    assert backend._loop.in_flight() == 0 and backend.in_flight == {url: 0}


def test_sync_loads_every_adapter_into_every_server(fakes, tiny_model_dir):
    from peft import get_peft_model
    from tiny import tiny_lora
    from transformers import AutoModelForCausalLM

    (one, url_one), (two, url_two) = fakes(), fakes()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_lora(), adapter_name="generator")
    model.add_adapter("evaluator", tiny_lora())
    backend = VLLMServerBackend([url_one, url_two], tokenizer, ["generator", "evaluator"], {}, [0])
    backend.sync_adapters(model)
    backend.sync_adapters(model, ["evaluator"])
    for server in (one, two):
        assert server.seen["/v1/load_lora_adapter"] == 4  # generator, evaluator, the zero adapter; evaluator again
        assert server.seen["/v1/unload_lora_adapter"] == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(vllm_server_base_urls="node0:8000"), "must list http\\(s\\) URLs"),
        (dict(vllm_server_base_urls="http://a:1", vllm_server_base_url="http://b:1"), "not both"),
        (dict(vllm_server_base_urls="http://a:1", vllm_mode="colocate"), "is for vllm_mode='server'"),
        (dict(vllm_server_max_concurrency=0), "must be >= 1"),
        (dict(rollout_mode="async", rollout_backend="transformers"), "batches per tick. Set rollout_backend='vllm'"),
    ],
)
def test_server_and_mode_settings_are_checked(tmp_path, overrides, message):
    from tiny import tiny_config

    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **{"rollout_backend": "vllm", "vllm_mode": "server", **overrides})


def test_several_urls_parse_from_the_command_line(tmp_path):
    from tiny import tiny_config

    config = tiny_config(
        tmp_path,
        rollout_backend="vllm",
        vllm_mode="server",
        vllm_server_base_urls="http://node0:8000, http://node1:8000",
    )
    assert config.vllm_server_base_urls == ["http://node0:8000", "http://node1:8000"]


def test_server_backend_sends_the_reference_prompt(fakes, tiny_model_dir):
    from rollout.test_chat_rendering import REFERENCE_PROMPT, SECOND_EVALUATOR_CALL

    server, url = fakes()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = synced(
        VLLMServerBackend(url, tokenizer, ["generator", "evaluator"], {}, [0], chat_rendering="reference_qwen")
    )
    (result,) = backend.generate([GenerationRequest("evaluator", SECOND_EVALUATOR_CALL)])
    expected = tokenizer.encode(REFERENCE_PROMPT, add_special_tokens=False)  # as the reference tokenizes it
    assert [body["prompt"] for body in server.bodies] == [expected] and result.prompt_ids == expected
