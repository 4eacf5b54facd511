"""vLLM server mode with roles on several base models: each base has its own `vllm serve` URLs
(``vllm_server_base_urls`` as a dict), waits for their health like one base does, and each base's adapters are
loaded into its own servers only. Stand-in servers on 127.0.0.1 play vLLM's routes."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest
from tiny import tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.rollout.backends.from_config import sync_adapters
from trl_multiagent.rollout.backends.per_base import PerBaseBackend
from trl_multiagent.rollout.backends.vllm_server import ServerError


class RecordingVLLM(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply({})

    def do_POST(self):
        self.server.posts.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        self._reply({})

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    started = []

    def start():
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RecordingVLLM)
        httpd.daemon_threads, httpd.posts = True, []
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def server_trainer(model_dir, judge_dir, tmp_path, urls, **overrides):
    settings = dict(
        max_steps=1,
        policy_sharing="isolated",
        rollout_backend="vllm",
        vllm_mode="server",
        vllm_server_base_urls=urls,
        role_models={"evaluator": judge_dir},
        vllm_server_timeout=5,
    )
    return tiny_trainer(model_dir, tmp_path, EvalOpt(max_iterations=1), **{**settings, **overrides})


def test_each_base_syncs_its_adapters_to_its_own_servers(tiny_model_dir, tiny_judge_dir, tmp_path, servers):
    (main, main_url), (judge, judge_url) = servers(), servers()
    urls = json.dumps({tiny_model_dir: [main_url], tiny_judge_dir: judge_url})  # as given on the command line
    trainer = server_trainer(tiny_model_dir, tiny_judge_dir, tmp_path, urls)
    backend = trainer.rollout_backend
    assert isinstance(backend, PerBaseBackend)
    assert {base: b.base_urls for base, b in backend.backends.items()} == {
        tiny_model_dir: [main_url],
        tiny_judge_dir: [judge_url],
    }
    sync_adapters(backend, trainer._updates.installed.by_base(trainer.model), is_main_process=True)
    loaded = {
        name: {body["lora_name"].split("@")[0] for route, body in httpd.posts if route == "/v1/load_lora_adapter"}
        for name, httpd in (("main", main), ("judge", judge))
    }
    assert "generator" in loaded["main"] and "evaluator" not in loaded["main"]
    assert "evaluator" in loaded["judge"] and "generator" not in loaded["judge"]


def test_a_base_without_servers_or_a_dead_server_fails_naming_it(tiny_model_dir, tiny_judge_dir, tmp_path, servers):
    _, main_url = servers()
    with pytest.raises(ValueError, match="gives no servers for base model"):
        server_trainer(tiny_model_dir, tiny_judge_dir, tmp_path, {tiny_model_dir: [main_url]})
    with pytest.raises(ValueError, match="give each base its own servers"):
        server_trainer(tiny_model_dir, tiny_judge_dir, tmp_path, [main_url])
    with pytest.raises(ValueError, match="names \\['org/other'\\], which no role sits on"):
        server_trainer(tiny_model_dir, tiny_judge_dir, tmp_path, {tiny_model_dir: main_url, "org/other": main_url})
    with socket.socket() as s:  # a port nothing listens on: the judge's server is down
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ServerError, match=f"No vLLM server answered at {dead}/health"):
        server_trainer(
            tiny_model_dir,
            tiny_judge_dir,
            tmp_path,
            {tiny_model_dir: main_url, tiny_judge_dir: dead},
            vllm_server_timeout=1,
        )
