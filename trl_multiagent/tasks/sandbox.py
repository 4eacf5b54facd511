"""Run untrusted programs against tests: one contained process per run, many problems in parallel.

Containment, per run (``sandbox_boot.py`` does the in-namespace part):
- new network, mount and PID namespaces (``unshare``): no network at all (only a loopback that is down), host
  processes invisible, and when the run ends the kernel kills whatever the program left behind;
- the program runs as a leased, otherwise unused uid with no groups and ``no_new_privs``: RLIMIT_NPROC binds it
  (it doesn't bind root), it can't signal the trainer or read its ``/proc/<pid>/environ``, and setuid binaries
  can't give privileges back;
- not root (``sandbox_mode() == "userns"``): the same namespaces, made inside a new user namespace
  (``unshare --user --map-root-user``); the program then runs in a second, nested user namespace as the leased uid,
  with no capability over the sandbox's namespaces (so it can't undo the mounts below), and RLIMIT_NPROC counts
  per user namespace, i.e. only this run's processes. To the kernel it is still the invoking user: files of that
  user stay protected only by being hidden or read-only, so the user's ``$HOME`` is hidden too, and a host
  filesystem that can't be made read-only is a setup error, not a best effort; the user's supplementary groups
  stay (dropping them needs root);
- the host filesystem is read-only in the namespace; ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``,
  ``/root`` and ``/home`` are replaced by empty size-limited tmpfs; the working directory is a fresh
  ``tempfile.mkdtemp`` path (a private tmpfs inside), removed afterwards; the environment is a fixed minimal one;
- rlimits on CPU time, address space, processes, file size (= stdout size) and open files, plus a deadline on the
  program's own time (wall-clock time less its waits for a CPU: a busy machine does not fail a program; at most
  ``MAX_STRETCH`` times the limit in real time) enforced inside the namespace and, as a backstop, by the host.
Not hidden: world-readable files outside those directories stay readable (e.g. the trainer's source code).

One run executes one test, so a crash or a patched builtin can't leak into the next test, and the program never
sees expected outputs. A problem's tests together may also get a time budget (``ProblemTime``), as the paper's grader
gives each problem's whole run one. Requires util-linux ``unshare`` and root or unprivileged user namespaces;
``check_sandbox_support`` says what is missing.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import json
import logging
import marshal
import os
import random
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

BOOT_SCRIPT = Path(__file__).with_name("sandbox_boot.py")
# Leased uids: far above any real or container-mapped user, one per concurrently running program (machine-wide,
# via flock), so RLIMIT_NPROC counts only that program's processes.
UID_BASE, UID_COUNT = 3_000_000_000, 4096
LOCK_DIR = Path(tempfile.gettempdir()) / f"trl_multiagent_sandbox_uids-{os.getuid()}"  # one per invoking user
_SITE_PACKAGES = [p for p in site.getsitepackages() if os.path.isdir(p)]
HOST_GRACE_SECONDS = 5.0  # startup allowance on top of the in-sandbox deadline before the host kills the run
# A run's time limit counts the program's own time: wall-clock time less its waits for a CPU, so that a program is not
# failed because others kept the machine busy. Those waits stretch its deadline at most this far in real time (a fork
# bomb's children crowding out its main process would stretch it without end).
MAX_STRETCH = 10.0

# The names LeetCode-style graders define before a solution runs (rLLM's LiveCodeBench grader, which the paper uses on
# every DeepCoder source, stdin and function-call alike): a ``class Solution`` method annotated ``List[int]`` or a
# program calling ``defaultdict`` without importing it runs there, so it must run here. Plain imports come last, so
# ``bisect`` ends up the module, as in that grader.
PRELUDE_SOURCE = """\
from bisect import bisect, bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, defaultdict, deque
from copy import deepcopy
from functools import cache, cmp_to_key, lru_cache, partial, reduce
from heapq import heapify, heappop, heappush, heapreplace, merge, nlargest, nsmallest
from itertools import (
    accumulate, chain, combinations, count, cycle, groupby, islice, pairwise, permutations, product, repeat,
    zip_longest,
)
from math import atan2, ceil, comb, factorial, floor, gcd, inf, isqrt, log, log2, log10, pi, prod, sqrt
from operator import iand, itemgetter, or_, sub, xor
from os.path import commonprefix
from random import randrange, shuffle
from re import search as re_search
from string import ascii_lowercase, ascii_uppercase
from time import time
from typing import (
    Any, Callable, Deque, Dict, Generator, Iterable, Iterator, List, Optional, Set, Tuple, Union,
)
import bisect, collections, copy, datetime, functools, heapq, io, itertools, math, operator, os, random, re
import string, sys
"""
# Bound as modules that load on first attribute access: importing pandas costs ~0.4 s, once per worker in that
# grader but once per test here (every test is a fresh process).
PRELUDE_LAZY_MODULES = {"np": "numpy", "pd": "pandas"}


class Outcome(StrEnum):
    """How one run, or one problem's test suite, ended."""

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"  # wall-clock deadline or CPU-time limit
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"  # stdout reached max_output_bytes (the output is truncated there)
    SANDBOX_ERROR = "sandbox_error"  # our fault, not the program's: the run could not be set up


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. Defaults follow the paper's grader (a few seconds per test, 4 GiB address space)."""

    cpu_seconds: int = 4
    wall_seconds: float = 6.0  # the program's own time: wall-clock time less its waits for a CPU
    memory_bytes: int = 4 * 2**30
    max_processes: int = 32  # processes + threads of the program's uid
    max_output_bytes: int = 8 * 2**20  # RLIMIT_FSIZE: caps stdout and any file the program writes
    max_open_files: int = 64
    disk_bytes: int = 64 * 2**20  # each tmpfs the program can write to (its cwd, /tmp...)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value}.")
        if self.max_open_files < 16:
            raise ValueError(f"SandboxLimits.max_open_files={self.max_open_files} is too low for Python; use >= 16.")


@dataclass(frozen=True)
class ProblemTime:
    """The wall-clock time one program may spend on a problem's tests together: ``per_test`` seconds a test plus
    ``extra``, at most ``most``. The defaults are the paper's grader's, which kills the process running a problem's
    tests after min((3 s per test + 1) x tests + 5, 120) seconds and scores the problem 0 (rllm/rewards/
    code_reward.py:249-303, used in training: rllm/engine/agent_workflow_engine.py:28-29). What counts is the
    programs' own time (``Execution.run_seconds``), not the sandbox's setup of each run."""

    per_test: float = 4.0
    extra: float = 5.0
    most: float = 120.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0 or (name == "most" and value == 0):
                raise ValueError(f"ProblemTime.{name} must be > 0 (per_test and extra >= 0), got {value}.")

    def seconds(self, tests: int) -> float:
        return min(self.per_test * tests + self.extra, self.most)


@dataclass(frozen=True)
class TestCase:
    """One test: what the program gets and what it must produce."""

    __test__ = False  # not a pytest test class, despite the name
    input: Any  # stdin text (stdin_stdout) or the list of positional arguments (function_call)
    output: Any  # expected stdout text, or the expected return value as a JSON value


@dataclass(frozen=True)
class TestSuite:
    """A problem's tests; ``to_json``/``from_json`` give the dataset's ``tests`` column.

    JSON form: ``{"kind": "stdin_stdout" | "function_call", "fn_name": str | null,
    "cases": [{"input": ..., "output": ...}, ...], "prelude": bool}``. For ``stdin_stdout`` input/output are text
    and outputs are compared line by line after stripping (numbers as decimals, so ``2.50`` matches ``2.5``). For
    ``function_call`` input is the list of positional arguments and output the return value (not wrapped);
    the program must define ``fn_name`` at module level or as a method of ``class Solution``. ``prelude``: run
    ``PRELUDE_SOURCE`` (and bind ``PRELUDE_LAZY_MODULES``) in the program's namespace first, as LeetCode-style
    graders do (DeepCoder rows); absent in the JSON means False.
    """

    __test__ = False  # not a pytest test class, despite the name

    kind: Literal["stdin_stdout", "function_call"]
    cases: tuple[TestCase, ...]
    fn_name: str | None = None
    prelude: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("stdin_stdout", "function_call"):
            raise ValueError(f"TestSuite.kind must be 'stdin_stdout' or 'function_call', got {self.kind!r}.")
        if self.kind == "function_call" and not self.fn_name:
            raise ValueError("A function_call TestSuite needs fn_name (the function the tests call).")
        if not self.cases:
            raise ValueError("A TestSuite needs at least one test case.")

    def to_json(self) -> str:
        cases = [{"input": c.input, "output": c.output} for c in self.cases]
        return json.dumps({"kind": self.kind, "fn_name": self.fn_name, "cases": cases, "prelude": self.prelude})

    @classmethod
    def from_json(cls, text: str | dict) -> TestSuite:
        data = json.loads(text) if isinstance(text, str) else text
        cases = tuple(TestCase(c["input"], c["output"]) for c in data["cases"])
        return cls(kind=data["kind"], cases=cases, fn_name=data.get("fn_name"), prelude=data.get("prelude", False))


@dataclass(frozen=True)
class Execution:
    """One run of a program. ``failure`` is None when it exited cleanly (its output then decides)."""

    failure: Outcome | None
    stdout: str
    result: str | None  # JSON text of the called function's return value (function_call runs only)
    exit_code: int | None  # negative: killed by that signal
    detail: str  # why it failed, with the tail of stderr
    cpu_seconds: float
    wall_seconds: float  # the whole run, the sandbox's setup included
    run_seconds: float = 0.0  # the program's own time, from its start to its exit, less its waits for a CPU


@dataclass(frozen=True)
class TestReport:
    """A program graded on a suite. ``outcome`` is PASSED only when every test passed."""

    __test__ = False  # not a pytest test class, despite the name

    outcome: Outcome
    passed: int
    total: int
    outcomes: tuple[Outcome, ...] = field(default=())  # one per executed test; fewer than total when stopped early
    detail: str = ""

    @property
    def executed(self) -> int:
        return len(self.outcomes)


NAMESPACES = ["--net", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private"]
USER_NAMESPACE = ["--user", "--map-root-user"]


@functools.cache
def sandbox_mode() -> Literal["root", "userns"]:
    """How this process can sandbox: as root, or (not root) inside unprivileged user namespaces."""
    if shutil.which("unshare") is None:
        raise RuntimeError("The code sandbox needs util-linux `unshare` on PATH (apt-get install util-linux).")
    if os.geteuid() == 0:
        return "root"
    probe = subprocess.run(["unshare", *USER_NAMESPACE, *NAMESPACES, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(
            "The code sandbox needs root or unprivileged user namespaces, and `unshare --user --map-root-user` "
            f"failed here: {probe.stderr.strip() or f'exit code {probe.returncode}'}. Enable them "
            "(`sysctl -w user.max_user_namespaces=15000`; Debian: `sysctl -w kernel.unprivileged_userns_clone=1`; "
            "Ubuntu 24.04+: `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in Docker: "
            "`--security-opt seccomp=unconfined`), or train as root (e.g. in a container), or use a task whose "
            "reward doesn't execute code."
        )
    return "userns"


def check_sandbox_support() -> None:
    """Raise with the fix when this machine can't run the sandbox."""
    sandbox_mode()


def sandbox_available() -> bool:
    try:
        sandbox_mode()
    except RuntimeError:
        return False
    return True


_leased: set[int] = set()
_leased_lock = threading.Lock()


@contextmanager
def _lease_uid() -> Iterator[int]:
    """An uid no other running program uses, in this process (set) or any other (flock on a lock file)."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    start = random.randrange(UID_COUNT)
    for step in range(UID_COUNT):
        uid = UID_BASE + (start + step) % UID_COUNT
        with _leased_lock:
            if uid in _leased:
                continue
            _leased.add(uid)
        fd = os.open(LOCK_DIR / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            with _leased_lock:
                _leased.discard(uid)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
            with _leased_lock:
                _leased.discard(uid)
        return
    raise RuntimeError(f"All {UID_COUNT} sandbox uids are in use; lower the number of concurrent sandbox workers.")


def _tail(data: bytes, max_lines: int = 12, max_chars: int = 1500) -> str:
    lines = data[-max_chars:].decode("utf-8", errors="replace").strip().splitlines()
    return "\n".join(lines[-max_lines:] if len(data) <= max_chars else lines[1:][-max_lines:])  # no cut first line


def _classify(status: dict, stdout_size: int, stderr: str, has_result: bool, call: str | None, limits: SandboxLimits):
    """(failure outcome or None, reason) from the in-sandbox status record."""
    if "setup_error" in status:
        return Outcome.SANDBOX_ERROR, f"sandbox setup failed: {status['setup_error']}"
    if status.get("wall_timeout"):
        return Outcome.TIMEOUT, f"time limit of {limits.wall_seconds}s exceeded (wall-clock, waits for a CPU left out)"
    code = status["exit_code"]
    last_line = stderr.splitlines()[-1] if stderr else ""
    # SIGXCPU comes only from RLIMIT_CPU's soft limit; SIGKILL also from its hard limit (soft + 1), if caught.
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and status["cpu_seconds"] >= limits.cpu_seconds):
        return Outcome.TIMEOUT, f"CPU-time limit of {limits.cpu_seconds}s exceeded"
    if stdout_size >= limits.max_output_bytes or code == -signal.SIGXFSZ:
        return Outcome.OUTPUT_LIMIT, f"output limit of {limits.max_output_bytes} bytes reached; output truncated"
    if last_line.startswith("MemoryError") or "Cannot allocate memory" in stderr:
        return Outcome.MEMORY_LIMIT, f"address-space limit of {limits.memory_bytes} bytes reached"
    if code != 0:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return Outcome.RUNTIME_ERROR, f"{how}: {last_line}" if last_line else how
    if call is not None and not has_result:
        return Outcome.RUNTIME_ERROR, f"the program exited before {call}() returned"
    return None, ""


_OUTPUT_FILES = ("stdout", "stderr", "status", "result")  # written by the sandbox into the host workdir


def _launch(workdir: Path, uid: int, call: str | None, limits: SandboxLimits, *, prelude: bool) -> bool:
    """Run the boot script on the files in ``workdir``; True when the host had to kill it."""
    with ExitStack() as files:
        fin = files.enter_context(open(workdir / "stdin", "rb"))
        fout, ferr, fstatus, fresult = (files.enter_context(open(workdir / n, "wb")) for n in _OUTPUT_FILES)
        cfg = {
            **asdict(limits),
            "uid": uid,
            "workdir": str(workdir),
            "program": str(workdir / "solution.py"),
            "call": call,
            "prelude": {"source": PRELUDE_SOURCE, "lazy_modules": PRELUDE_LAZY_MODULES} if prelude else None,
            "site_packages": _SITE_PACKAGES,
            "status_fd": fstatus.fileno(),
            "result_fd": fresult.fileno(),
            "userns": sandbox_mode() == "userns",
            "max_stretch": MAX_STRETCH,
            # not root, the program is this user to the kernel: hide the user's files wherever their home is
            "hide": [os.path.realpath(Path.home())] if sandbox_mode() == "userns" else [],
        }
        cmd = ["unshare", *(USER_NAMESPACE if cfg["userns"] else []), *NAMESPACES]
        # -S: site's .pth hooks (e.g. editable installs) cost more than the run; the child adds site-packages itself.
        cmd += [sys.executable, "-I", "-S", str(BOOT_SCRIPT), marshal.dumps(cfg).hex()]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "TMPDIR": str(workdir)}
        env |= {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # threads count against max_processes
        proc = subprocess.Popen(
            cmd,
            stdin=fin,
            stdout=fout,
            stderr=ferr,
            cwd=workdir,
            env=env,
            start_new_session=True,
            pass_fds=(fstatus.fileno(), fresult.fileno()),
        )
        # The in-namespace deadline is the precise one; this only catches a boot that hangs. A pidfd wakes us the
        # moment the run ends (Popen.wait(timeout) polls with sleeps of up to 50 ms, a third of a typical run).
        pidfd = os.pidfd_open(proc.pid)
        try:
            finished = select.select([pidfd], [], [], limits.wall_seconds * MAX_STRETCH + HOST_GRACE_SECONDS)[0]
        finally:
            os.close(pidfd)
        if not finished:
            os.killpg(proc.pid, signal.SIGKILL)  # killing the namespace's init kills everything inside it
        proc.wait()
        return not finished


def execute(
    source: str,
    stdin: str = "",
    *,
    call: str | None = None,
    limits: SandboxLimits | None = None,
    prelude: bool = False,
) -> Execution:
    """Run ``source`` once in a fresh sandbox with ``stdin`` as its input.

    With ``call``, the program is imported (as module ``solution``) and ``call`` is invoked with the positional
    arguments JSON-encoded in ``stdin``; the JSON of its return value comes back in ``Execution.result``. With
    ``prelude``, ``PRELUDE_SOURCE`` runs in the program's namespace first (its line numbers stay the program's).
    """
    check_sandbox_support()
    limits = limits or SandboxLimits()
    workdir = Path(tempfile.mkdtemp(prefix="trl_ma_sandbox_"))
    started = time.monotonic()
    try:
        (workdir / "solution.py").write_text(source, encoding="utf-8")
        (workdir / "stdin").write_text(stdin, encoding="utf-8")
        with _lease_uid() as uid:
            host_killed = _launch(workdir, uid, call, limits, prelude=prelude)
        wall = time.monotonic() - started
        stdout = (workdir / "stdout").read_bytes()[: limits.max_output_bytes]
        stderr = _tail((workdir / "stderr").read_bytes())
        result = (workdir / "result").read_text(encoding="utf-8", errors="replace") or None
        records = [ast.literal_eval(line) for line in (workdir / "status").read_text().splitlines() if line.strip()]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    status: dict[str, Any] = {k: v for record in records for k, v in record.items()}
    if host_killed:
        failure, detail = Outcome.TIMEOUT, f"the host killed the run after {wall:.1f}s"
    elif not status:
        failure, detail = Outcome.SANDBOX_ERROR, "the sandbox exited without a status"
    else:
        failure, detail = _classify(status, len(stdout), stderr, result is not None, call, limits)
    if failure is not None and stderr:
        detail = f"{detail}\n{stderr}"  # the program's traceback, useful as feedback and in logs
    if failure is Outcome.SANDBOX_ERROR:
        logger.warning("sandbox error: %s", detail)
    return Execution(
        failure=failure,
        stdout=stdout.decode("utf-8", errors="replace"),
        result=result,
        exit_code=status.get("exit_code"),
        detail=detail,
        cpu_seconds=status.get("cpu_seconds", 0.0),
        wall_seconds=wall,
        run_seconds=status.get("run_seconds", wall),
    )


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None


def stdout_matches(actual: str, expected: str) -> bool:
    """Line-by-line comparison that ignores surrounding whitespace and number formatting (``2.50`` == ``2.5``)."""
    got = [line.strip() for line in actual.strip().splitlines()]
    want = [line.strip() for line in expected.strip().splitlines()]
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g != w:
            gd, wd = _decimals(g), _decimals(w)
            if gd is None or wd is None or gd != wd:
                return False
    return True


def _grade_case(source: str, suite: TestSuite, case: TestCase, limits: SandboxLimits) -> tuple[Outcome, str, float]:
    """The outcome of one case, why it failed, and the program's own run time."""
    if suite.kind == "stdin_stdout":
        run = execute(source, str(case.input), limits=limits, prelude=suite.prelude)
        if run.failure is not None:
            return run.failure, run.detail, run.run_seconds
        if stdout_matches(run.stdout, str(case.output)):
            return Outcome.PASSED, "", run.run_seconds
        return Outcome.WRONG_ANSWER, f"expected {str(case.output)[:200]!r}, got {run.stdout[:200]!r}", run.run_seconds
    run = execute(source, json.dumps(case.input), call=suite.fn_name, limits=limits, prelude=suite.prelude)
    if run.failure is not None:
        return run.failure, run.detail, run.run_seconds
    try:
        value = json.loads(run.result or "")
    except json.JSONDecodeError:
        detail = f"{suite.fn_name} returned a value that is not JSON: {run.result!r:.200}"
        return Outcome.WRONG_ANSWER, detail, run.run_seconds
    # Round-trip the expectation through JSON too, so tuples/lists and int/float keys compare alike.
    if value == json.loads(json.dumps(case.output)):
        return Outcome.PASSED, "", run.run_seconds
    call = f"{suite.fn_name}(*{json.dumps(case.input)[:100]})"
    detail = f"{call}: expected {json.dumps(case.output)[:100]}, got {json.dumps(value)[:100]}"
    return Outcome.WRONG_ANSWER, detail, run.run_seconds


def run_tests(
    source: str,
    suite: TestSuite,
    *,
    limits: SandboxLimits | None = None,
    stop_at_first_failure: bool = True,
    problem_time: ProblemTime | None = None,
) -> TestReport:
    """Grade a program on every case of ``suite``, each case in its own sandbox run. With ``problem_time``, the runs
    together get ``problem_time.seconds(len(suite.cases))`` of the program's time: each run's wall-clock limit is at
    most what is left, and a run cut by the budget ends the grading there (the rest of the tests are not run) with
    the problem a timeout, as the paper's grader kills a problem's whole run at its deadline."""
    limits = limits or SandboxLimits()
    budget = problem_time.seconds(len(suite.cases)) if problem_time is not None else None
    used = 0.0
    outcomes: list[Outcome] = []
    first_detail = ""
    for case in suite.cases:
        left = None if budget is None else budget - used
        cut = left is not None and left < limits.wall_seconds
        if cut and left <= 0:
            outcome, detail, seconds = Outcome.TIMEOUT, "", 0.0
        else:
            run_limits = replace(limits, wall_seconds=left) if cut else limits
            outcome, detail, seconds = _grade_case(source, suite, case, run_limits)
        used += seconds
        if cut and outcome is Outcome.TIMEOUT:
            outcomes.append(outcome)
            first_detail = first_detail or (
                f"test {len(outcomes) - 1}: the problem's time budget of {budget:g}s for {len(suite.cases)} tests "
                "ran out"
            )
            break
        outcomes.append(outcome)
        if outcome is not Outcome.PASSED:
            first_detail = first_detail or f"test {len(outcomes) - 1}: {detail}"
            if stop_at_first_failure:
                break
    passed = outcomes.count(Outcome.PASSED)
    overall = next((o for o in outcomes if o is not Outcome.PASSED), Outcome.PASSED)
    report = TestReport(overall, passed, len(suite.cases), tuple(outcomes), first_detail)
    logger.debug(
        "program graded: %s (%d/%d passed, %d run) %s",
        overall.value,
        passed,
        report.total,
        report.executed,
        first_detail[:300],
    )
    return report


class SandboxPool:
    """Grades many (program, tests) problems in parallel, at most ``max_workers`` sandboxes at a time.

    Each worker thread drives one sandboxed subprocess at a time; a problem's tests run in order on one worker
    so it can stop at the first failure. ``problem_time``: each problem's budget (``run_tests``); None: none.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        limits: SandboxLimits | None = None,
        problem_time: ProblemTime | None = None,
    ) -> None:
        check_sandbox_support()
        self.max_workers = max_workers or os.cpu_count() or 1
        if self.max_workers > UID_COUNT:
            raise ValueError(f"max_workers={self.max_workers} exceeds the {UID_COUNT} sandbox uids; lower it.")
        self.limits = limits or SandboxLimits()
        self.problem_time = problem_time
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="sandbox")

    def run(
        self, problems: Sequence[tuple[str, TestSuite]], *, stop_at_first_failure: bool = True
    ) -> list[TestReport]:
        """One TestReport per (source, suite), in order."""
        futures = [
            self._executor.submit(
                run_tests,
                source,
                suite,
                limits=self.limits,
                stop_at_first_failure=stop_at_first_failure,
                problem_time=self.problem_time,
            )
            for source, suite in problems
        ]
        reports = [f.result() for f in futures]
        counts = Counter(r.outcome.value for r in reports)
        logger.info("sandbox graded %d programs: %s", len(reports), dict(sorted(counts.items())))
        return reports

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
