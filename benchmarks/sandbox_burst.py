"""The sandbox under a burst: many programs submitted at once, some hostile, every verdict right and nothing escaped.

    python benchmarks/sandbox_burst.py                  # as root (the sandbox needs it): 256 programs, 2 workers
    python benchmarks/sandbox_burst.py --workers 32     # 16 sandboxes per core: the time limits under contention

`--programs` programs go to one `SandboxPool.run` call at once, `--hostile` of them hostile, one of each kind in turn:
fork bombs (one that swallows the error and forks on, one that crashes), memory hogs, infinite loops, sleepers,
writes outside the working folder (a host folder anyone may write to, /etc, the host's /tmp) and network attempts
(a listening socket on the host's loopback, an internet address). The honest rest are the toy code problems'
reference solutions (3 tests each), a fifth of them wrong, and a fifth busy for `--busy` CPU seconds before
answering right, which under `--workers 32` on 2 cores takes many times that in wall-clock time: the sandbox's time
limit counts the program's own time (wall-clock less its waits for a CPU), so they still pass.

Checked after the burst: each program's outcome is the one its kind must get; the victim file is intact, nothing was
written where the hostile programs wrote, the host's listener got no connection; no sandboxed process is left
running and no working folder is left behind. Exits 1 if any check fails. The last line is
``RESULT sandbox_burst value=<programs graded per second> programs=<n> hostile=<n> wrong_verdicts=<n> escaped=<n>
left_behind=<n>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from trl_multiagent.tasks import sandbox
from trl_multiagent.tasks.sandbox import Outcome, SandboxLimits, SandboxPool, TestCase, TestSuite
from trl_multiagent.tasks.toy_code import PROBLEMS, make_toy_code_problem

# Tight limits so that the hostile programs end soon, and little memory: 32 sandboxes at once on a shared machine.
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=3.0, memory_bytes=512 * 2**20, max_output_bytes=2**20)
VICTIMS = Path("/var/lib/trl-multiagent-burst-victims")  # not under /tmp or /home, which the sandbox hides
FOREVER = "while True:\n    "


class Victims:
    """What hostile programs aim at on the host: a file to keep, a folder anyone may write to, a path in the host's
    /tmp, a listening loopback socket. ``harmed()`` lists what changed."""

    def __init__(self) -> None:
        VICTIMS.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(dir=VICTIMS))
        self.folder.chmod(0o755)
        self.keep = self.folder / "keep.txt"
        self.keep.write_text("intact")
        self.open_folder = self.folder / "world_writable"
        self.open_folder.mkdir()
        self.open_folder.chmod(0o777)
        self.host_tmp = Path("/tmp") / f"sandbox_burst_escape_{os.getpid()}"
        self.etc = Path(f"/etc/sandbox_burst_escape_{os.getpid()}")
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.setblocking(False)

    def harmed(self) -> list[str]:
        harm = [] if self.keep.read_text() == "intact" else ["the victim file changed"]
        harm += [f"{path} written" for path in (*self.open_folder.iterdir(), self.host_tmp, self.etc) if path.exists()]
        with contextlib.suppress(BlockingIOError):
            self.listener.accept()
            harm.append("the host's loopback listener got a connection")
        return harm

    def close(self) -> None:
        self.listener.close()
        shutil.rmtree(self.folder)
        for path in (self.host_tmp, self.etc):
            path.unlink(missing_ok=True)


def hostile_kinds(victims: Victims) -> dict[str, tuple[str, Outcome]]:
    """kind -> (program, the outcome it must get)."""
    connect = "import socket\nsocket.create_connection(({!r}, {}), timeout=1)"
    return {
        "fork bomb": (
            f"import os\n{FOREVER}try:\n        os.fork()\n    except OSError:\n        pass",
            Outcome.TIMEOUT,
        ),
        "fork bomb that crashes": (f"import os\n{FOREVER}os.fork()", Outcome.RUNTIME_ERROR),
        "memory hog": (f"hog = []\n{FOREVER}hog.append(bytearray(2**24))", Outcome.MEMORY_LIMIT),
        "infinite loop": (f"{FOREVER}pass", Outcome.TIMEOUT),
        "sleeper": ("import time\ntime.sleep(600)", Outcome.TIMEOUT),
        "writes a shared host folder": (
            f"open({str(victims.open_folder / 'x')!r}, 'w').write('x')",
            Outcome.RUNTIME_ERROR,
        ),
        "writes /etc": (f"open({str(victims.etc)!r}, 'w').write('x')", Outcome.RUNTIME_ERROR),
        # /tmp is a private tmpfs in the sandbox: the write works there, and must not reach the host's /tmp.
        "writes the host's /tmp": (
            f"open({str(victims.host_tmp)!r}, 'w').write('x')\nprint('wrote')",
            Outcome.WRONG_ANSWER,
        ),
        "connects to the host": (
            connect.format("127.0.0.1", victims.listener.getsockname()[1]),
            Outcome.RUNTIME_ERROR,
        ),
        "connects to the internet": (connect.format("1.1.1.1", 53), Outcome.RUNTIME_ERROR),
    }


def burst(n: int, hostile: int, busy: float, victims: Victims, seed: int) -> list[tuple[str, str, TestSuite, Outcome]]:
    """(kind, program, tests, the outcome it must get) of ``n`` programs, ``hostile`` of them hostile, shuffled."""
    rng = random.Random(seed)
    kinds = hostile_kinds(victims)
    programs = []
    for i in range(hostile):
        kind = sorted(kinds)[i % len(kinds)]
        program, outcome = kinds[kind]
        programs.append((kind, program, TestSuite("stdin_stdout", (TestCase("", "never\n"),)), outcome))
    problems = sorted(PROBLEMS)
    for i in range(n - hostile):
        _, suite, solution = make_toy_code_problem(rng, problems[i % len(problems)], num_tests=3)
        if i % 5 == 1:
            programs.append(
                ("honest, wrong", "import sys\nsys.stdin.read()\nprint('no idea')", suite, Outcome.WRONG_ANSWER)
            )
        elif i % 5 == 2:
            spin = f"import time\nstart = time.process_time()\nwhile time.process_time() - start < {busy}:\n    pass\n"
            programs.append((f"honest, busy {busy:g} CPU s", spin + solution, suite, Outcome.PASSED))
        else:
            programs.append(("honest", solution, suite, Outcome.PASSED))
    rng.shuffle(programs)
    return programs


def sandboxed_processes(uids: set[int]) -> list[int]:
    """Pids of processes still running as one of the sandbox's ``uids`` (as root a program runs as its leased uid;
    not root, as this user in another PID namespace)."""
    own_namespace = os.readlink("/proc/self/ns/pid")
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
            if uid in uids or (
                sandbox.sandbox_mode() == "userns"
                and uid == os.getuid()
                and os.readlink(entry / "ns" / "pid") != own_namespace
            ):
                pids.append(int(entry.name))
    return pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=256)
    parser.add_argument("--hostile", type=float, default=0.1, help="share of hostile programs")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="sandboxes at a time (default: cores)")
    parser.add_argument("--busy", type=float, default=0.3, help="CPU seconds of the busy honest programs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # Working folders in a folder of this run's own, to see that none is left behind; the sandbox's uid locks stay in
    # the shared place, so that runs of other processes never lease the same uid.
    tempfile.tempdir = tempfile.mkdtemp(prefix="sandbox_burst_")
    leased: set[int] = set()
    lease = sandbox._lease_uid

    @contextlib.contextmanager
    def recording_lease():  # the uids this run's programs ran as, to look for their processes afterwards
        with lease() as uid:
            leased.add(uid)
            yield uid

    sandbox._lease_uid = recording_lease
    victims = Victims()
    try:
        hostile = round(args.programs * args.hostile)
        programs = burst(args.programs, hostile, args.busy, victims, args.seed)
        with SandboxPool(max_workers=args.workers, limits=LIMITS) as pool:
            began = time.perf_counter()
            reports = pool.run([(program, suite) for _, program, suite, _ in programs])
            seconds = time.perf_counter() - began
        harm = victims.harmed()
        left_running = sandboxed_processes(leased)
        left_files = os.listdir(tempfile.tempdir)
    finally:
        victims.close()
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)

    by_kind: dict[str, Counter] = {}
    wrong = []
    for (kind, _, _, expected), report in zip(programs, reports):
        by_kind.setdefault(f"{kind} -> {expected.value}", Counter())[report.outcome.value] += 1
        if report.outcome is not expected:
            wrong.append(f"{kind}: expected {expected.value}, got {report.outcome.value}: {report.detail[:300]}")
    tests_run = sum(r.executed for r in reports)
    print(
        f"{args.programs} programs ({hostile} hostile) at once, {args.workers} workers on {os.cpu_count()} cores, "
        f"limits {LIMITS.cpu_seconds} CPU s / {LIMITS.wall_seconds} s own time each"
    )
    print(f"{'kind -> the outcome it must get':<52}  outcomes")
    for kind, outcomes in sorted(by_kind.items()):
        print(f"{kind:<52}  {dict(outcomes)}")
    print(f"wall {seconds:.1f} s: {args.programs / seconds:.2f} programs/s, {tests_run / seconds:.2f} tests run/s")
    for line in (*wrong, *harm):
        print(f"FAILED: {line}")
    if left_running or left_files:
        print(f"FAILED: left behind: processes {left_running}, working folders {left_files}")
    left = len(left_running) + len(left_files)
    print(
        f"RESULT sandbox_burst value={args.programs / seconds:.2f} programs={args.programs} hostile={hostile} "
        f"wrong_verdicts={len(wrong)} escaped={len(harm)} left_behind={left}",
        flush=True,
    )
    return 1 if wrong or harm or left else 0


if __name__ == "__main__":
    sys.exit(main())
