"""How a `vllm serve` server fails a trainer, and what the error tells the user to do next.

A server that stops serving mid-run (``ServerLostError``) has one of six causes, each told by what the client saw:

    died      the connection was refused or dropped on every retry: its process died or was stopped
    stalled   no answer within ``vllm_request_timeout``
    engine    HTTP 500 naming vLLM's EngineCore: the engine process died (an out-of-memory kill lands there), and the
              server shuts itself down after answering the requests it held
    failed    another HTTP 5xx to a completion, or 502-504 on every retry (a 500 loading an adapter is vLLM refusing
              it, e.g. a rank above --max-lora-rank: an error of its own, no lost server)
    restarted HTTP 404 for an adapter this run loaded: the server came back without it
    garbled   HTTP 200 to a completion, with a body that is not one (not JSON, or no single choice with its token ids
              and log-probs): something between the client and the server, or the server itself, corrupted it

The message names the server and the cause, and (``with_next_steps``) how to restart it and resume the run.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ...common.deprecation import moved_names

CAUSES = {
    "died": "its process died or was stopped",
    "stalled": "it is stalled or overloaded (or its completions need longer: raise vllm_request_timeout)",
    "engine": "its engine process (vLLM's EngineCore) died, e.g. killed for lack of memory (see the server's log and "
    "`dmesg`), and the server shuts down with it",
    "failed": "the server failed (see its log)",
    "restarted": "it restarted since this run loaded its adapters, and no longer holds them",
    "garbled": "its answer was corrupted on the way or by the server (see its log, and any proxy in front of it)",
}


class ServerError(RuntimeError):
    pass


class ServerLostError(ServerError):
    """A server that stopped serving this run; ``url``, ``cause`` (a key of ``CAUSES``) and ``detail`` (what the
    client saw, the transport error's name and text included) stay readable for failover."""

    def __init__(self, url: str, cause: str, detail: str, *, next_steps: str = ""):
        self.url, self.cause, self.detail = url, cause, detail
        message = f"vLLM server {url} {detail}: {CAUSES[cause]}."
        super().__init__(f"{message} {next_steps}" if next_steps else message)

    def with_next_steps(self, next_steps: str) -> ServerLostError:
        return ServerLostError(self.url, self.cause, self.detail, next_steps=next_steps)


# `ServerLost`, this error's name before PEP 8's `Error` suffix, still works until it is removed (with a warning).
__getattr__ = moved_names(__name__)


def engine_died(status: int, text: str) -> bool:
    """A 500 whose body names vLLM's engine process (``EngineDeadError: EngineCore encountered an issue``)."""
    return status == 500 and ("EngineCore" in text or "EngineDead" in text)


def is_completion(answer: object) -> bool:
    """Whether a 200 answer to /v1/completions is one the client can read: one choice with its token ids and log-probs
    (anything else would fail later with a bare KeyError that names neither the server nor what to do)."""
    try:
        (choice,) = answer["choices"]
        return isinstance(choice["token_ids"], list) and isinstance(choice["logprobs"]["token_logprobs"], list)
    except (KeyError, TypeError, ValueError):
        return False


def restart_advice(url: str, cause: str) -> str:
    """How to get the server back: restart it (a stalled one if it stays stuck)."""
    port = urlsplit(url).port
    flags = f" --port {port}" if port else ""
    command = f"`trl-multiagent vllm-serve --config <your training yaml>{flags}`; `--dry-run` prints the command"
    if cause == "stalled":
        return f"Look at its log, and restart it if it stays stuck ({command})"
    if cause == "garbled":
        return f"Look at its log, and restart it if it keeps answering so ({command})"
    return f"Restart it ({command})"
