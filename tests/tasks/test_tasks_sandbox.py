"""The sandbox: hostile programs are contained and reported with the right outcome; grading and the pool.

Every hostile program below would harm the test process or the machine if it escaped: the tests check both the
reported outcome and that the harm did not happen.
"""

import dataclasses
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from harness import needs_sandbox

from trl_multiagent.tasks import sandbox
from trl_multiagent.tasks.code import CodeReward
from trl_multiagent.tasks.sandbox import (
    Outcome,
    ProblemTime,
    SandboxLimits,
    SandboxPool,
    TestCase,
    TestSuite,
    execute,
    run_tests,
    sandbox_available,
    sandbox_mode,
    stdout_matches,
)

pytestmark = needs_sandbox

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.5, memory_bytes=256 * 2**20, max_output_bytes=2**20)
# Programs that must end on their own get room, so a loaded machine can't turn their outcome into a timeout.
ROOMY = dataclasses.replace(LIMITS, cpu_seconds=10, wall_seconds=20)
SECRET = "trl-ma-test-secret-4f1c"


@pytest.fixture(autouse=True)
def leased_uids(monkeypatch):
    """The sandbox uids this test's runs used (other processes, e.g. a benchmark, may be using others)."""
    used = set()
    lease = sandbox._lease_uid

    @contextmanager
    def recording_lease():
        with lease() as uid:
            used.add(uid)
            yield uid

    monkeypatch.setattr(sandbox, "_lease_uid", recording_lease)
    return used


def leftover_processes(uids: set[int]) -> list[int]:
    """Pids of sandboxed processes still running (there should never be any after a run).

    As root: processes under one of the leased ``uids``. Not root, the host sees sandboxed programs as this user:
    processes of this user in another PID namespace than this one.
    """
    own_pid_namespace = os.readlink("/proc/self/ns/pid")
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
            elsewhere = os.readlink(entry / "ns" / "pid") != own_pid_namespace
        except (OSError, IndexError, ValueError):
            continue
        if uid in uids or (
            sandbox_mode() == "userns" and uid == os.getuid() and elsewhere and not run_by_another_process(entry)
        ):
            pids.append(int(entry.name))
    return pids


def run_by_another_process(process: Path) -> bool:
    """Whether ``process`` belongs to a sandbox run another process started (another pytest-xdist worker's, say).

    Not root, every sandboxed program is this user in some other PID namespace, so the uid alone can't tell this
    test's runs from the other worker's. The process's first ancestor in this namespace can: a live run hangs under
    the ``unshare`` its starter spawned; a program that outlived its run would hang under this process's own
    ``unshare`` or, orphaned, under init.
    """
    own_pid_namespace = os.readlink("/proc/self/ns/pid")
    try:
        while os.readlink(process / "ns" / "pid") != own_pid_namespace:
            process = Path("/proc") / (process / "status").read_text().split("\nPPid:")[1].split()[0]
        starter = int((process / "status").read_text().split("\nPPid:")[1].split()[0])
        return (process / "comm").read_text().strip() == "unshare" and starter != os.getpid()
    except (OSError, IndexError):
        return False  # gone while we looked: it can't be left over either


@pytest.fixture
def victim(request):
    """A host file a hostile program can see (outside the directories the sandbox hides) but must not touch.

    Next to it, a world-writable directory: only the sandbox's read-only view of the host stops writes there.
    A fresh directory per test: other test sessions may run these tests at the same time in the same checkout.
    """
    # Not under the checkout: a checkout under /tmp or /home would be hidden from the sandbox, not read-only.
    base = Path("/var/lib/trl-multiagent-test-victims")
    base.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=base))
    directory.chmod(0o755)
    path = directory / "keep.txt"
    path.write_text("intact")
    path.chmod(0o644)
    (directory / "world_writable").mkdir()
    (directory / "world_writable").chmod(0o777)
    yield path
    shutil.rmtree(directory)


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    yield server
    server.close()


def hostile_programs(victim: Path, port: int) -> dict[str, tuple[str, Outcome]]:
    """case -> (program, the outcome it must be reported with)."""
    forever = "while True:\n    "
    connect = "import socket\nsocket.create_connection(({!r}, {}), timeout=1)"
    shell = "import os\nos.execv('/bin/sh', ['sh', '-c', {!r}])"
    swallowing_fork_bomb = f"import os\n{forever}try:\n        os.fork()\n    except OSError:\n        pass"
    fill_disk = "import itertools\nfor i in itertools.count():\n    open(f'f{i}', 'wb').write(b'x' * 2**19)"
    outside = str(victim.parent / "world_writable" / "evil.txt")
    return {
        "fork bomb": (swallowing_fork_bomb, Outcome.TIMEOUT),
        "fork bomb that crashes": (f"import os\n{forever}os.fork()", Outcome.RUNTIME_ERROR),
        "infinite loop": (f"{forever}pass", Outcome.TIMEOUT),
        "sleeps past the deadline": ("import time\ntime.sleep(60)", Outcome.TIMEOUT),
        "memory hog": (f"hog = []\n{forever}hog.append(bytearray(2**24))", Outcome.MEMORY_LIMIT),
        "huge output": (f"{forever}print('x' * 4096)", Outcome.OUTPUT_LIMIT),
        "fills its disk": (fill_disk, Outcome.RUNTIME_ERROR),
        "writes outside its dir": (f"open({outside!r}, 'w').write('x')", Outcome.RUNTIME_ERROR),
        "writes /etc": ("open('/etc/evil_by_sandbox', 'w').write('x')", Outcome.RUNTIME_ERROR),
        "opens a local socket": (connect.format("127.0.0.1", port), Outcome.RUNTIME_ERROR),
        "opens an internet socket": (connect.format("1.1.1.1", 53), Outcome.RUNTIME_ERROR),
        "resolves a hostname": ("import socket\nsocket.getaddrinfo('huggingface.co', 443)", Outcome.RUNTIME_ERROR),
        "kills the parent": (f"import os\nos.kill({os.getpid()}, 9)", Outcome.RUNTIME_ERROR),
        # As root the kill is refused (another uid); in a user namespace the parent is the same user to the kernel,
        # which then drops the signal silently, because the parent is its PID namespace's init: no output.
        "kills its own parent": (
            "import os\nos.kill(os.getppid(), 9)",
            Outcome.WRONG_ANSWER if sandbox_available() and sandbox_mode() == "userns" else Outcome.RUNTIME_ERROR,
        ),
        "kills everything": ("import os\nos.kill(-1, 9)", Outcome.RUNTIME_ERROR),
        "deletes a file": (f"import os\nos.remove({str(victim)!r})", Outcome.RUNTIME_ERROR),
        "execs a shell that writes /etc": (shell.format("echo x > /etc/evil_by_sandbox"), Outcome.RUNTIME_ERROR),
        "shell kills everything": (f"import os\nos.system('kill -9 -1 {os.getpid()}')", Outcome.RUNTIME_ERROR),
        "shell deletes a file": (shell.format(f"rm -f {victim} && echo deleted"), Outcome.RUNTIME_ERROR),
    }


HOSTILE_CASES = sorted(hostile_programs(Path("/x"), 0))


@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_hostile_program_is_contained_with_the_right_outcome(case, victim, listener, caplog, leased_uids):
    program, expected = hostile_programs(victim, listener.getsockname()[1])[case]
    with caplog.at_level(logging.DEBUG, logger="trl_multiagent.tasks.sandbox"):
        limits = LIMITS if expected is Outcome.TIMEOUT else ROOMY
        report = run_tests(program, TestSuite("stdin_stdout", (TestCase("", "never"),)), limits=limits)
    assert report.outcome is expected, report.detail
    assert report.detail  # every failure says why
    assert expected.value in caplog.text  # and is logged
    # The harm did not happen: the host, this process and the machine are as before.
    assert victim.read_text() == "intact"
    assert not (victim.parent / "world_writable" / "evil.txt").exists() and not Path("/etc/evil_by_sandbox").exists()
    with pytest.raises(TimeoutError):
        listener.accept()
    assert leftover_processes(leased_uids) == []


def test_reading_the_parents_secrets_finds_nothing(monkeypatch):
    monkeypatch.setenv("TRL_MA_TEST_SECRET", SECRET)
    program = f"""
import glob, os
found = [k for k, v in os.environ.items() if {SECRET!r} in v]
for path in glob.glob('/proc/*/environ') + ['/proc/{os.getpid()}/environ', '/proc/{os.getppid()}/environ']:
    try:
        if {SECRET!r}.encode() in open(path, 'rb').read():
            found.append(path)
    except OSError:
        pass
print('LEAK', found) if found else print('SAFE')
print(sorted(os.environ))
"""
    run = execute(program, limits=ROOMY)
    assert run.failure is None and run.stdout.splitlines()[0] == "SAFE", run.stdout + run.detail
    assert "TRL_MA_TEST_SECRET" not in run.stdout


def test_a_spawned_shell_is_as_contained_as_the_program(victim, leased_uids):
    script = f"id -u; echo x > /etc/evil_by_sandbox; rm -f {victim}; kill -9 {os.getpid()}; ls -a /root"
    program = f"import subprocess\nr = subprocess.run({script!r}, shell=True, capture_output=True, text=True)\n"
    program += "print(r.stdout)\nprint(r.stderr)"
    run = execute(program, limits=ROOMY)
    assert run.failure is None, run.detail
    uid = int(run.stdout.split()[0])
    assert uid >= sandbox.UID_BASE  # the shell runs as the unprivileged sandbox uid, never root
    assert run.stdout.count("Read-only file system") == 2  # /etc and the victim's directory
    assert "kill: No such process" in run.stdout  # this process isn't even visible from inside
    assert victim.read_text() == "intact" and not Path("/etc/evil_by_sandbox").exists()
    assert leftover_processes(leased_uids) == []


def test_writes_to_tmp_land_in_a_private_tmpfs():
    marker = Path("/tmp/trl_ma_sandbox_escape_test")
    marker.unlink(missing_ok=True)
    run = execute(f"open({str(marker)!r}, 'w').write('x')\nprint(open({str(marker)!r}).read())", limits=ROOMY)
    assert run.failure is None and run.stdout == "x\n"
    assert not marker.exists()


def test_a_daemon_left_behind_is_killed_with_the_run(leased_uids):
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('bye')"
    assert execute(program, limits=ROOMY).stdout == "bye\n"
    assert leftover_processes(leased_uids) == []


def test_each_run_gets_a_fresh_working_directory():
    first = execute("import os\nprint(os.getcwd(), os.listdir('.'))\nopen('left_behind', 'w')", limits=ROOMY)
    second = execute("import os\nprint(os.getcwd(), os.listdir('.'))", limits=ROOMY)
    (cwd1, listing1), (cwd2, listing2) = (r.stdout.split(" ", 1) for r in (first, second))
    assert cwd1 != cwd2 and listing1.strip() == listing2.strip() == "[]"
    assert not Path(cwd1).exists() and not Path(cwd2).exists()  # removed from the host afterwards


def test_pool_runs_hostile_and_honest_programs_side_by_side(leased_uids):
    # A fork bomb exhausts only its own uid's process limit: honest programs running at the same time still pass.
    echo = TestSuite("stdin_stdout", tuple(TestCase(f"{i}\n", f"{i}\n") for i in range(3)))
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    problems = [(bomb, echo)] + [("print(input())", echo)] * 6
    with SandboxPool(max_workers=3, limits=LIMITS) as pool:
        reports = pool.run(problems)
    assert [r.outcome for r in reports] == [Outcome.TIMEOUT] + [Outcome.PASSED] * 6
    assert leftover_processes(leased_uids) == []


def test_stop_at_first_failure_versus_running_all_tests():
    suite = TestSuite("stdin_stdout", tuple(TestCase(f"{i}\n", f"{i}\n") for i in range(5)))
    program = "n = int(input())\nprint(n if n != 1 else 'oops')\nassert n != 3"
    first = run_tests(program, suite, limits=ROOMY)
    assert (first.outcome, first.passed, first.executed) == (Outcome.WRONG_ANSWER, 1, 2)
    assert first.detail.startswith("test 1: expected '1\\n', got 'oops\\n'")
    every = run_tests(program, suite, limits=ROOMY, stop_at_first_failure=False)
    assert every.outcomes == (
        Outcome.PASSED,
        Outcome.WRONG_ANSWER,
        Outcome.PASSED,
        Outcome.RUNTIME_ERROR,
        Outcome.PASSED,
    )
    assert (every.outcome, every.passed, every.total) == (Outcome.WRONG_ANSWER, 3, 5)


def test_the_problem_time_is_the_paper_graders():
    """min((timeout + 1) x tests + 5, 120) seconds with its 3 s per test (rllm/rewards/code_reward.py:249,266), the
    code reward's default."""
    for tests in (1, 5, 28, 29, 200):
        assert ProblemTime().seconds(tests) == min((3 + 1) * tests + 5, 120)
    assert CodeReward().problem_time == ProblemTime()
    with pytest.raises(ValueError, match="ProblemTime.most must be > 0"):
        ProblemTime(most=0)


def test_a_problem_out_of_time_stops_its_grading():
    """Three tests of a program that waits 0.6 s in each: 1 s for the problem cuts the second test and ends the
    grading, a timeout (by the per-test rate or by the cap alike); 4 s lets all three pass. The same through a
    pool."""
    suite = TestSuite("stdin_stdout", tuple(TestCase(f"{i}\n", f"{i}\n") for i in range(3)))
    program = "import time\ntime.sleep(0.6)\nprint(input())"
    for tight in (ProblemTime(per_test=0.3, extra=0.1, most=100.0), ProblemTime(per_test=10.0, extra=10.0, most=1.0)):
        report = run_tests(program, suite, limits=ROOMY, problem_time=tight, stop_at_first_failure=False)
        assert (report.outcome, report.outcomes) == (Outcome.TIMEOUT, (Outcome.PASSED, Outcome.TIMEOUT))
        assert "the problem's time budget of 1s for 3 tests ran out" in report.detail
    roomy = ProblemTime(per_test=1.0, extra=1.0, most=100.0)
    assert run_tests(program, suite, limits=ROOMY, problem_time=roomy).outcome is Outcome.PASSED
    assert run_tests(program, suite, limits=ROOMY).outcome is Outcome.PASSED  # no budget: the per-test limits alone
    with SandboxPool(max_workers=2, limits=ROOMY, problem_time=ProblemTime(0.3, 0.1, 100.0)) as pool:
        assert [r.outcome for r in pool.run([(program, suite), ("print(input())", suite)])] == [
            Outcome.TIMEOUT,
            Outcome.PASSED,
        ]


def test_function_call_tests():
    suite = TestSuite("function_call", (TestCase([[3, 1, 2]], [1, 2, 3]), TestCase([[]], [])), fn_name="sort_it")
    assert run_tests("def sort_it(xs):\n    return sorted(xs)", suite, limits=ROOMY).outcome is Outcome.PASSED
    method = "class Solution:\n    def sort_it(self, xs):\n        return tuple(sorted(xs))"  # tuple == JSON list
    assert run_tests(method, suite, limits=ROOMY).outcome is Outcome.PASSED
    wrong = run_tests("def sort_it(xs):\n    return xs", suite, limits=ROOMY)
    assert wrong.outcome is Outcome.WRONG_ANSWER and "expected [1, 2, 3], got [3, 1, 2]" in wrong.detail
    missing = run_tests("def other(xs):\n    return xs", suite, limits=ROOMY)
    assert missing.outcome is Outcome.RUNTIME_ERROR and "no function 'sort_it'" in missing.detail
    exits = run_tests("import sys\nsys.exit(0)\ndef sort_it(xs):\n    return xs", suite, limits=ROOMY)
    assert exits.outcome is Outcome.RUNTIME_ERROR
    odd = run_tests("def sort_it(xs):\n    return {1, 2, 3}", suite, limits=ROOMY)  # a set is not JSON
    assert odd.outcome is Outcome.WRONG_ANSWER


def test_the_graders_import_prelude_runs_only_for_suites_that_ask_for_it():
    method = "class Solution:\n    def count(self, xs: List[int]) -> int:\n        return len(xs)"
    suite = TestSuite("function_call", (TestCase([[4, 5]], 2),), fn_name="count")
    bare = run_tests(method, suite, limits=ROOMY)
    assert bare.outcome is Outcome.RUNTIME_ERROR and "NameError: name 'List' is not defined" in bare.detail
    assert run_tests(method, dataclasses.replace(suite, prelude=True), limits=ROOMY).outcome is Outcome.PASSED
    # numpy and pandas are bound but load on first use (a fresh run per test can't pay pandas' import each time)
    program = (
        "print('pandas.core' in sys.modules, defaultdict(int)[0], bisect.bisect([1, 2], 1), comb(4, 2))\n"
        "print(pd.DataFrame({'a': [1, 2]}).a.sum(), np.arange(4).sum(), 'pandas.core' in sys.modules)"
    )
    # pandas loads pyarrow, whose allocator reserves ~450 MB of address space: far above the 256 MB other tests allow
    with_pandas = dataclasses.replace(ROOMY, memory_bytes=2**30)
    run = execute(program, limits=with_pandas, prelude=True)
    assert (run.failure, run.stdout) == (None, "False 0 1 6\n3 6 True\n"), run.detail
    assert execute(program, limits=ROOMY).detail.endswith("NameError: name 'sys' is not defined")
    error = execute("x = 1\nraise ValueError(x)", limits=ROOMY, prelude=True)
    assert 'File "solution.py", line 2, in <module>' in error.detail  # the program keeps its line numbers
    assert TestSuite.from_json(dataclasses.replace(suite, prelude=True).to_json()).prelude is True


def test_runtime_errors_read_like_the_programs_own_traceback():
    run = execute("def f():\n    return 1 / 0\nf()", limits=ROOMY)
    assert run.failure is Outcome.RUNTIME_ERROR and run.exit_code == 1
    assert 'File "solution.py", line 2, in f' in run.detail and "ZeroDivisionError" in run.detail
    assert "sandbox_boot" not in run.detail
    assert execute("import sys\nsys.exit(3)", limits=ROOMY).detail.startswith("exit code 3")
    assert execute("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", limits=ROOMY).detail.startswith(
        "killed by SIGSEGV"
    )


def test_a_broken_sandbox_is_a_sandbox_error_not_a_program_error(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "BOOT_SCRIPT", Path("/nonexistent/sandbox_boot.py"))
    with caplog.at_level(logging.WARNING):
        run = execute("print(1)", limits=ROOMY)
    assert run.failure is Outcome.SANDBOX_ERROR
    assert "sandbox error" in caplog.text


@pytest.mark.parametrize(
    ("actual", "expected", "same"),
    [
        ("6\n", "6", True),
        ("  6  \n\n", "6\n", True),
        ("1 2\n3\n", "1 2\n3", True),
        ("2.50\n", "2.5\n", True),
        ("1e3", "1000", True),
        ("6\n", "7\n", False),
        ("1 2 3", "1 2", False),
        ("1\n2", "1 2", False),
        ("abc", "ABC", False),
        ("", "0", False),
    ],
)
def test_stdout_comparison(actual, expected, same):
    assert stdout_matches(actual, expected) is same


def test_limits_and_suites_validate_with_fixes():
    with pytest.raises(ValueError, match="cpu_seconds must be > 0"):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValueError, match="needs fn_name"):
        TestSuite("function_call", (TestCase([1], 1),))
    with pytest.raises(ValueError, match="at least one test case"):
        TestSuite("stdin_stdout", ())


def test_outcomes_are_explicit():
    assert {o.value for o in Outcome} == {
        "passed",
        "wrong_answer",
        "runtime_error",
        "timeout",
        "memory_limit",
        "output_limit",
        "sandbox_error",
    }


@contextmanager
def busy_cpu(cpu: int, processes: int):
    """``processes`` host processes spinning on CPU ``cpu``: a machine kept busy by other work."""
    spinners = [
        # Each in a session of its own, as the sandbox's runs are: with the kernel's autogroups a session shares the
        # CPU with other sessions as one.
        subprocess.Popen(
            [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"],
            start_new_session=True,
        )
        for _ in range(processes)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_the_time_limit_is_the_programs_own_not_the_machines():
    """A program that needs 0.4 s of CPU, on a CPU shared with 7 spinning processes, takes about 3 s of wall-clock
    time: the limit of 1.5 s counts only its own time (its waits for the CPU left out), so it passes; the wait is
    stretched at most ``MAX_STRETCH`` times the limit. A sleeping program beside the same spinners is out of time,
    since sleeping is its own."""
    pinned = "import os, time\nos.sched_setaffinity(0, {0})\n"
    busy = pinned + "start = time.process_time()\nwhile time.process_time() - start < 0.4:\n    pass\nprint('done')"
    sleeper = pinned + "time.sleep(3)\nprint('done')"
    limits = dataclasses.replace(LIMITS, cpu_seconds=5, wall_seconds=1.5)
    with busy_cpu(0, processes=7):
        ran = execute(busy, limits=limits)
        slept = execute(sleeper, limits=limits)
    assert (ran.failure, ran.stdout) == (None, "done\n"), ran.detail
    assert slept.failure is Outcome.TIMEOUT and "time limit of 1.5s exceeded" in slept.detail
