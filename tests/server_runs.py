"""Training runs against real `vllm serve` servers, started the way users start them (`trl-multiagent vllm-serve`),
and the checks that every call of such a run was served by its own adapter at its own version.

Shared by tests/rollout/vllm_backends/test_vllm_server_lifecycle.py and the run it kills
(tests/workers/vllm_server_worker.py). Needs vLLM (the CPU build, installed as in .ci/run).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch
from harness import launch_offline, tail
from rollout.vllm_backends.test_vllm_backend import length_reward
from tiny import tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.monitoring.adapter_check import GAP_THRESHOLD
from trl_multiagent.rollout.backends.base import Provenance

ROLES = ("generator", "evaluator")  # EvalOpt's, isolated policy: the servers' --max-loras 3
SERVER_FLAGS = ["--workflow", "eval_opt", "--lora_r", "4", "--host", "127.0.0.1"]
VLLM_FLAGS = ["--dtype", "float32", "--enforce-eager", "--seed", "0"]  # passed through to vLLM


def server_trainer(model_dir, output_dir, urls, **settings):
    """EvalOpt on the tiny model through the servers at ``urls``, one adapter per role, a step logged each step."""
    run = dict(logging_steps=1, learning_rate=1e-2, seed=0, policy_sharing="isolated", reward_funcs=length_reward)
    vllm = dict(rollout_backend="vllm", vllm_mode="server", vllm_server_base_urls=urls, vllm_server_timeout=300)
    return tiny_trainer(model_dir, output_dir, EvalOpt(max_iterations=2), **{**run, **vllm, **settings})


def randomize_adapters(trainer, seed: int) -> None:
    """Random, different adapters: a zero B is the base model for every role, where serving the wrong one shows not."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for role in ROLES:
            for name, param in adapter_parameters(trainer.model, trainer.role_adapters[role]).items():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def record_stamps(trainer) -> list[tuple[int, set]]:
    """(step, {(role, provenance)}) of every rollout from now on, filled as the trainer rolls out."""
    stamps, run = [], trainer.engine.run

    def recording(prompts, on_episode_end=None):
        step = trainer.state.global_step
        episodes = run(prompts, on_episode_end)
        stamps.append((step, {(c.role, c.provenance) for e in episodes for c in e.calls}))
        return episodes

    trainer.engine.run = recording
    return stamps


def assert_served_by_own_adapters(trainer, stamps) -> None:
    """Every call stamped, by the server's answer, with its role's adapter at the step it was rolled out at; no
    `adapter_mismatch`, and the sampler's log-probs those of the trained weights (a server that served other weights
    than its stamps say would show here)."""
    assert stamps
    for step, seen in stamps:
        assert {provenance for _, provenance in seen} == {Provenance(role, step, "vllm-server") for role in ROLES}
    logs = [h for h in trainer.state.log_history if "loss" in h and h["step"] > stamps[0][0]]  # not a resumed run's
    assert len(logs) == len(stamps)
    for role in ROLES:
        assert [h[f"role/{role}/adapter_mismatch"] for h in logs] == [0.0] * len(logs)
        assert max(h[f"role/{role}/sampler_gap_mean"] for h in logs) < GAP_THRESHOLD["fp32"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, now."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        found.append(parent)
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                todo += [int(child) for child in children.read_text().split()]
            except OSError:  # the task ended meanwhile
                pass
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def shared_memory_of(pids) -> set[str]:
    """The files directly in /dev/shm that ``pids`` map (vLLM's shared memory; not the trainers' adapter folders,
    whose files a server maps too)."""
    found = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        paths = {line.split(None, 5)[-1].removesuffix(" (deleted)") for line in lines if " /dev/shm/" in line}
        found |= {path for path in paths if Path(path).parent == Path("/dev/shm")}
    return found


def wait_for(predicate, what: str, limit: float) -> None:
    """Poll until ``predicate()`` holds; the limit only keeps a broken test from hanging."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


class Servers:
    """`trl-multiagent vllm-serve` processes on loopback, one per slot, started and restarted on their own port."""

    def __init__(self, model_dir: str, logs: Path, count: int):
        self.model_dir, self.logs = model_dir, logs
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen | None] = [None] * count
        self.starts = [0] * count

    def url(self, slot: int) -> str:
        return f"http://127.0.0.1:{self.ports[slot]}"

    def start(self, slot: int) -> None:
        """Start the server of ``slot`` (returns at once; ``up`` waits for it)."""
        self.starts[slot] += 1
        command = [sys.executable, "-m", "trl_multiagent.cli", "vllm-serve", "--model", self.model_dir, *SERVER_FLAGS]
        command += ["--port", str(self.ports[slot]), *VLLM_FLAGS]
        log = self.logs / f"server{slot}-{self.starts[slot]}.log"
        env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
        self.processes[slot] = launch_offline(command, log=log, env=env, unset=["VLLM_ENABLE_V1_MULTIPROCESSING"])

    def up(self, *slots: int) -> list[str]:
        """The URLs of ``slots``, each server started if it is not running, once all answer /health."""
        for slot in slots:
            if self.processes[slot] is None or self.processes[slot].poll() is not None:
                self.start(slot)
        for slot in slots:
            self.wait_healthy(slot)
        return [self.url(slot) for slot in slots]

    def wait_healthy(self, slot: int) -> None:
        def answers() -> bool:
            assert self.processes[slot].poll() is None, tail(self.logs / f"server{slot}-{self.starts[slot]}.log")
            return healthy(self.url(slot))

        wait_for(answers, f"server {slot} to answer /health", limit=600)

    def engine_pid(self, slot: int) -> int:
        tree = descendants(self.processes[slot].pid)
        (pid,) = [pid for pid in tree if b"VLLM::EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        return pid

    def stop(self, slot: int, how: signal.Signals) -> None:
        """Send ``how`` to the `vllm-serve` process of ``slot``; return once its whole tree is gone and the
        /dev/shm files the tree mapped with it."""
        process = self.processes[slot]
        tree = descendants(process.pid)
        assert len(tree) >= 4, tree  # vllm-serve, the API server, its engine and its worker (and the watchdog)
        files = shared_memory_of(tree)
        process.send_signal(how)
        self.wait_gone(tree, files)
        process.wait(timeout=60)

    @staticmethod
    def wait_gone(tree, files, limit: float = 120) -> None:
        wait_for(lambda: not any(map(alive, tree)), f"every process of {tree} to end", limit)
        wait_for(lambda: not any(Path(f).exists() for f in files), f"{sorted(files)} to go", limit)

    def stop_all(self) -> None:
        """SIGTERM every server still running, each checked as ``stop`` does; a failed check is raised once all
        were stopped."""
        failed = None
        for slot, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                try:
                    self.stop(slot, signal.SIGTERM)
                except AssertionError as error:
                    failed = error
                    process.kill()
        if failed is not None:
            raise failed
