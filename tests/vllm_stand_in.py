"""A stand-in `vllm serve` on 127.0.0.1 that keeps vLLM 0.32's adapter registry rules (what the server client meets on
a server that outlives trainers), and fails the ways a real server does. No vLLM needed.

Rules taken from vLLM's OpenAI server (``entrypoints/openai/models/serving.py``, ``serve/engine/serving.py``):
loading a name already loaded answers 400 "has already been loaded" (unless ``load_inplace``); unloading an unknown
name answers 404; a completion for an unknown model answers 404 "The model `x` does not exist."; a completion's answer
names the adapter that served it in ``model`` (``answer_as``: another name, as a server that mixed up its adapters
would; ``load_error``: a load's 500, as when the engine refuses an adapter). ``mode`` switches how completions fail:

    "serve"   answer (one token, id 7)
    "stall"   hold the request until the test ends
    "engine"  answer 500 with the body vLLM sends when its EngineCore died
    "drop"    close the connection without an answer, as a process that dies mid-request does
    "garbage" answer 200 with a body that is not JSON, as a corrupted answer arrives
    "cut"     send the headers and half the body of one answer, then close the connection (a truncated answer); the
              mode is "serve" again from then on

``hold`` (a number): completions wait until that many were open at once, so that a client's bound on requests in
flight is reached if it lets them (after 5 s without, the waiting stops); ``peak`` is the most completions ever open
at once.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections import Counter

ENGINE_DEAD = {
    "error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError",
        "code": 500,
    }
}


class StandInVLLM(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.server.connections.add(self.connection)

    def _reply(self, code: int, body: dict | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str) -> None:
        self._reply(code, {"error": {"message": message, "code": code}})

    def do_GET(self):
        if self.path == "/v1/models":
            self._reply(200, {"data": [{"id": name, "root": path} for name, path in self.server.adapters.items()]})
        else:
            self._reply(200, {})

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.seen[self.path] += 1
        server.posts.append((self.path, body))
        if self.path == "/v1/load_lora_adapter":
            name = body["lora_name"]
            if server.load_error:  # vLLM's answer when the engine refuses the adapter
                return self._error(500, server.load_error)
            if name in server.adapters and not body.get("load_inplace"):
                return self._error(
                    400,
                    f"The lora adapter '{name}' has already been loaded. If you want to load "
                    "the adapter in place, set 'load_inplace' to True.",
                )
            server.adapters[name] = body["lora_path"]
            return self._reply(200, f"Success: LoRA adapter '{name}' added successfully.")
        if self.path == "/v1/unload_lora_adapter":
            if server.adapters.pop(body["lora_name"], None) is None:
                return self._error(404, f"The lora adapter '{body['lora_name']}' cannot be found.")
            return self._reply(200, "Success")
        with server.lock:
            server.open += 1
            server.peak = max(server.peak, server.open)
        try:
            return self._complete(server, body)
        finally:
            with server.lock:
                server.open -= 1

    def _complete(self, server, body: dict):
        if server.hold:
            waited = 0.0
            while server.peak < server.hold:
                if waited >= 5.0:  # never reached: the client holds fewer open; stop waiting for it
                    server.hold = 0
                    break
                server.release.wait(0.01)
                waited += 0.01
        if server.mode == "garbage":
            return self._reply(200, '{"id": "cmpl-1", "choices": [{"tok')
        if server.mode == "cut":
            server.mode = "serve"
            data = json.dumps({"model": body["model"], "choices": [{"index": 0, "token_ids": [7]}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if server.mode == "stall":
            server.release.wait(60)  # released at teardown; the bound only keeps a broken test from hanging
        if server.mode == "engine":
            return self._reply(500, ENGINE_DEAD)
        if server.mode == "drop":
            self.close_connection = True
            self.connection.close()
            return None
        if body["model"] not in server.adapters:
            return self._error(404, f"The model `{body['model']}` does not exist.")
        server.served.append(body["model"])
        choice = {"index": 0, "token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}
        return self._reply(200, {"model": server.answer_as or body["model"], "choices": [choice]})

    def log_message(self, *args):
        pass


def start_stand_in(port: int = 0, mode: str = "serve"):
    """A stand-in server (``adapters``: name -> path it holds; ``served``: the model of each completion answered);
    ``port`` 0 takes a free one. Returns the server and its URL; ``stop_stand_in`` ends it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), StandInVLLM)
    server.daemon_threads = True
    server.adapters, server.served, server.posts, server.seen = {}, [], [], Counter()
    server.connections = set()
    server.lock, server.open, server.peak, server.hold = threading.Lock(), 0, 0, 0
    server.mode, server.release, server.answer_as, server.load_error = mode, threading.Event(), None, None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def stop_stand_in(server) -> None:
    """Stop it as a process that dies does: its open connections close too."""
    server.release.set()
    server.shutdown()
    server.server_close()
    for connection in list(server.connections):
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass
