"""Servers that let only the trainer in: the client sends the API key `vllm serve` was started with (its
``VLLM_API_KEY``), a server refuses whoever lacks it with an error that says what to set and never shows the key, and
`trl-multiagent vllm-serve` names the key in the command it prints, or warns when it listens beyond localhost
without one.

A stand-in server on 127.0.0.1 checks the header as vLLM's authentication middleware does (every /v1 route; /health
stays open); no vLLM needed.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from trl_multiagent.cli import main
from trl_multiagent.rollout.backends.vllm_server import ServerError, VLLMServerBackend

KEY = "s3cret-key-for-the-test"


class KeyedVLLM(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply(200, {})  # /health needs no key

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.authorizations.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self._reply(401, {"error": "Unauthorized"})
        else:
            self._reply(
                200,
                {
                    "choices": [
                        {
                            "index": 0,
                            "token_ids": [7],
                            "logprobs": {"token_logprobs": [-0.5]},
                            "finish_reason": "length",
                        }
                    ]
                },
            )

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeyedVLLM)
    httpd.daemon_threads, httpd.authorizations = True, []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class Tok:
    def apply_chat_template(self, messages, **kwargs):
        if messages and isinstance(messages[0], list):  # a batch of conversations, as transformers takes them
            return [self.apply_chat_template(conversation, **kwargs) for conversation in messages]
        return [1, 2]

    def decode(self, ids, skip_special_tokens=True):
        return ""


def client(url: str, **kwargs) -> VLLMServerBackend:
    return VLLMServerBackend(url, Tok(), ["generator"], {"max_tokens": 1}, [0], timeout=10, **kwargs)


def test_only_the_key_the_server_was_started_with_gets_in(server, monkeypatch):
    httpd, url = server
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keyless = client(url)
    with pytest.raises(ServerError, match="requires an API key; set VLLM_API_KEY"):
        keyless.post(url, "/v1/completions", {"prompt": [1]})
    keyless.close()
    wrong = client(url, api_key="not-the-key")
    with pytest.raises(ServerError, match="another API key than this process's VLLM_API_KEY") as refused:
        wrong.post(url, "/v1/completions", {"prompt": [1]})
    assert "not-the-key" not in str(refused.value)
    wrong.close()

    monkeypatch.setenv("VLLM_API_KEY", KEY)  # the trainer's environment, as the server's
    trainer = client(url)
    assert trainer.post(url, "/v1/completions", {"prompt": [1]})["choices"][0]["token_ids"] == [7]
    trainer.close()
    assert httpd.authorizations == [None, "Bearer not-the-key", f"Bearer {KEY}"]


def test_vllm_serve_names_the_key_and_warns_without_one(monkeypatch, capsys):
    serve = ["vllm-serve", "--config", "toy", "--workflow", "voting", "--dry-run"]
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert main(serve) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith('--api-key "$VLLM_API_KEY"') and KEY not in out + err and "WARNING" not in err

    monkeypatch.delenv("VLLM_API_KEY")
    assert main(serve) == 0  # the default host, 0.0.0.0: reachable from elsewhere
    out, err = capsys.readouterr()
    assert "--api-key" not in out and "listens beyond this machine without an API key" in err
    assert main([*serve, "--host", "127.0.0.1"]) == 0
    assert "WARNING" not in capsys.readouterr().err
