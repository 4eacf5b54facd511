"""A proxy on 127.0.0.1 in front of a `vllm serve` server that passes every request through, except that it can spoil
one chosen completion's answer, or start a fault of the test's (a server killed or restarted) when a chosen
completion arrives, while the rest stay in flight.

    arm(nth, how)   the nth /v1/completions request from now on: "garbage" answers it 200 with a body that is not
                    JSON; "cut" sends its real answer's headers and half its body, then closes the connection; a
                    callable is called (on a thread of its own) when it arrives, and the request goes on as usual

A server that refuses or drops a request has the proxy close the client's connection without an answer, as the server
itself would have. No vLLM needed here; the standard library only.
"""

from __future__ import annotations

import http.client
import http.server
import select
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

GARBAGE = b'{"id": "cmpl-garbage", "choices": [{"tok'
UPSTREAM_TIMEOUT_S = 120  # far above a completion's time here (64 at once answer within ~30 s on a busy machine)


class _Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self._forward(None)

    def do_POST(self):
        self._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def _forward(self, body: bytes | None) -> None:
        proxy = self.server
        how = proxy.take(self.path) if body is not None else None
        if callable(how):
            threading.Thread(target=how, daemon=True).start()
            how = None
        if how == "garbage":
            return self._send(200, GARBAGE)
        # Bounded: a server shutting down (SIGTERM) waits for its open connections to close.
        upstream = http.client.HTTPConnection(proxy.target.hostname, proxy.target.port, timeout=UPSTREAM_TIMEOUT_S)
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            if not self._client_still_waits(upstream.sock):  # a cancelled call: the server's request goes with it
                self.close_connection = True
                return None
            answer = upstream.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException):  # the server refused or dropped it: so does the proxy
            self.close_connection = True
            return None
        finally:
            upstream.close()
        if how == "cut":
            self.send_response(answer.status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        return self._send(answer.status, data)

    def _client_still_waits(self, upstream: socket.socket) -> bool:
        """Wait for the server's answer to begin; False if the client closes its connection first. A client's own
        connection to the server would close then, and a server shutting down (SIGTERM) waits for it to close."""
        watched = [upstream, self.connection]
        while True:
            ready, _, _ = select.select(watched, [], [], UPSTREAM_TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"no answer within {UPSTREAM_TIMEOUT_S} s")
            if upstream in ready:
                return True
            if not self.connection.recv(1, socket.MSG_PEEK):
                return False
            watched = [upstream]  # the client sent more before its answer: only the server is watched from now on

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class LoopbackProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target_url: str):
        super().__init__(("127.0.0.1", 0), _Forward)
        self.target = urlsplit(target_url)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._lock = threading.Lock()
        self.completions = 0  # /v1/completions requests received
        self.spoiled: list[str] = []  # the faults that happened, in order
        self._armed: tuple[int, str | Callable[[], None]] | None = None
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def arm(self, nth: int, how: str | Callable[[], None]) -> None:
        with self._lock:
            self._armed = (self.completions + nth, how)

    def take(self, path: str) -> str | Callable[[], None] | None:
        """Count a request; the fault armed for it, if it is the chosen completion."""
        if path != "/v1/completions":
            return None
        with self._lock:
            self.completions += 1
            if self._armed is None or self._armed[0] != self.completions:
                return None
            how, self._armed = self._armed[1], None
            self.spoiled.append(how if isinstance(how, str) else getattr(how, "__name__", "callable"))
            return how

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away (a cancelled call) breaks the pipe of its answer: expected, and not a fault

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
