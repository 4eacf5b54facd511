"""`trl-multiagent vllm-serve` leaves nothing behind: the server's whole process tree stops with it, whether it is
stopped (SIGTERM, SIGINT: passed on) or killed (SIGKILL: its watchdog stops the tree), and the /dev/shm files the tree
had mapped go too. A stand-in server (a Python process with a child, as `vllm serve` has its engine) here; the real
`vllm serve` in tests/rollout/vllm_backends/test_vllm_server_lifecycle.py.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from harness import CHECKOUT

from trl_multiagent.cli.serve_process import group_members, stop_group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/proc") or not os.path.isdir("/dev/shm"), reason="needs Linux's /proc"),
]

# A server whose "engine" child maps files in /dev/shm, both ignoring SIGTERM when told to (a hung server); it writes
# the two pids where the test reads them.
STAND_IN = """
import os, signal, subprocess, sys, time
out, stubborn, files = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
engine = subprocess.Popen([sys.executable, "-c", f'''
import mmap, os, signal, time
if {stubborn}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
mapped = []
for path in {files!r}:
    with open(path, "a+b") as f:
        f.truncate(4096)
        mapped.append(mmap.mmap(f.fileno(), 4096))
open({out!r} + ".engine", "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
'''])
while not os.path.exists(out + ".engine"):
    time.sleep(0.05)
open(out, "w").write(f"{os.getpid()} {engine.pid}")
while True:
    time.sleep(0.1)
"""


def wait_for(predicate, what: str, limit: float = 60.0):
    """Poll ``predicate`` until it holds; the limit only keeps a broken test from hanging."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_stand_in(tmp_path, *, stubborn: bool, through_cli: bool, shared=()):
    """The stand-in server, started directly in a group of its own, or by `run_server` (as `vllm-serve` does), its
    engine mapping a /dev/shm file of its own and ``shared``; returns (the process started, the server's pid, its
    engine's pid, its own /dev/shm file)."""
    out, shm = tmp_path / "pids", f"/dev/shm/trl-ma-test-{uuid.uuid4().hex}"
    server = [sys.executable, "-c", STAND_IN, str(out), "1" if stubborn else "0", shm, *map(str, shared)]
    if through_cli:
        code = f"import sys, trl_multiagent.cli.serve_process as p; sys.exit(p.run_server({server!r}, {{}}))"
        env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
        started = subprocess.Popen([sys.executable, "-c", code], env=env)
    else:
        started = subprocess.Popen(server, start_new_session=True)
    wait_for(lambda: out.exists() and out.read_text().count(" ") == 1, "the stand-in server's pids")
    server_pid, engine_pid = map(int, out.read_text().split())
    return started, server_pid, engine_pid, shm


def cleanup(pids, files) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for path in files:
        if os.path.exists(path):
            os.unlink(path)


def test_a_hung_server_group_is_killed_and_only_its_own_shared_memory_removed(tmp_path):
    in_use = Path(f"/dev/shm/trl-ma-test-{uuid.uuid4().hex}")  # also mapped by this process, which lives on
    with open(in_use, "w+b") as f:
        f.truncate(4096)
        mapped = mmap.mmap(f.fileno(), 4096)
    started, server_pid, engine_pid, shm = start_stand_in(tmp_path, stubborn=True, through_cli=False, shared=[in_use])
    try:
        assert sorted(group_members(server_pid)) == sorted([server_pid, engine_pid])
        stop_group(server_pid, grace=1.0)  # SIGTERM is ignored: SIGKILL after the grace period
        started.wait(timeout=30)
        assert group_members(server_pid) == [] and not alive(engine_pid)
        assert not os.path.exists(shm) and in_use.exists()
    finally:
        mapped.close()
        cleanup([server_pid, engine_pid], [shm, in_use])


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_stopping_or_killing_vllm_serve_stops_the_server_and_its_engine(tmp_path, how):
    supervisor, server_pid, engine_pid, shm = start_stand_in(tmp_path, stubborn=False, through_cli=True)
    try:
        supervisor.send_signal(how)
        code = supervisor.wait(timeout=60)
        # the engine's file too, which nothing maps any longer (after SIGKILL, the watchdog removes it)
        gone = [lambda: not alive(server_pid), lambda: not alive(engine_pid), lambda: not os.path.exists(shm)]
        wait_for(lambda: all(check() for check in gone), "the server, its engine and its file to go")
        assert code == (-how if how == signal.SIGKILL else 128 + how)  # the server's own end on the signal passed on
    finally:
        cleanup([server_pid, engine_pid], [shm])


def test_a_signal_while_vllm_serve_starts_its_server_is_passed_on(tmp_path):
    # vllm-serve is signalled as soon as its server exists, before it may have started the watchdog: the signal still
    # reaches the server and nothing is left running (the SIGINT case above once waited in vain for a server left so).
    out, shm = tmp_path / "pids", f"/dev/shm/trl-ma-test-{uuid.uuid4().hex}"
    server = [sys.executable, "-c", STAND_IN, str(out), "0", shm]
    code = f"import sys, trl_multiagent.cli.serve_process as p; sys.exit(p.run_server({server!r}, {{}}))"
    supervisor = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(CHECKOUT)})
    children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children")
    while not children.read_text().split():  # no pause: the signal must come within the server's first milliseconds
        assert supervisor.poll() is None, "vllm-serve ended before starting its server"
    (server_pid,) = map(int, children.read_text().split()[:1])
    try:
        supervisor.send_signal(signal.SIGINT)
        supervisor.wait(timeout=60)
        wait_for(lambda: group_members(server_pid) == [], "the server and its engine to go")
    finally:
        cleanup(group_members(server_pid), [shm])
