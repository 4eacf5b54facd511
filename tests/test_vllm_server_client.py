"""The vLLM server client waits for the server, retries while it starts, and says how to start it when it can't.

A stand-in HTTP server on 127.0.0.1 plays vLLM's routes; no vLLM needed.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections import Counter

import pytest

from trl_multiagent.rollout.backends.vllm_backend import VLLMServerBackend


class FlakyServer(http.server.BaseHTTPRequestHandler):
    """Answers 503 to the first ``failures[route]`` requests of a route (a server still starting), then 200 (or 400
    for /v1/bad)."""

    failures: Counter = Counter()
    seen: Counter = Counter()

    def _answer(self) -> None:
        self.seen[self.path] += 1
        if self.seen[self.path] <= self.failures[self.path]:
            self.send_error(503)
        elif self.path == "/v1/bad":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"message": "adapter already loaded"}')
        else:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer()

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky_url():
    FlakyServer.failures, FlakyServer.seen = Counter({"/health": 2, "/v1/load_lora_adapter": 2}), Counter()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def client(url: str, timeout: float = 30.0) -> VLLMServerBackend:
    return VLLMServerBackend(url, None, ["generator", "evaluator"], {"max_tokens": 4}, [0], timeout=timeout)


def test_waits_for_health_and_retries_while_the_server_starts(flaky_url):
    backend = client(flaky_url)  # /health: 503, 503, then 200
    assert FlakyServer.seen["/health"] == 3
    assert backend._post("/v1/load_lora_adapter", {"lora_name": "generator", "lora_path": "/x"}) == b"{}"
    assert FlakyServer.seen["/v1/load_lora_adapter"] == 3  # two 503s retried with backoff
    with pytest.raises(RuntimeError, match="failed \\(400\\).*already loaded"):
        backend._post("/v1/bad", {})  # a client error is not retried
    assert FlakyServer.seen["/v1/bad"] == 1


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
