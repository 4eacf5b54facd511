"""Sandbox grading throughput: stop at the first failing test vs run every test.

200 generated toy programs (10 tests each), 80% of them failing: wrong on a random subset of inputs, crashing on
some inputs, or always wrong, so the first failure lands at varied test positions as with real model answers.
Both modes grade the same programs with the same pool; the verdict (all tests pass or not) must agree. "Graded
tests/s" counts every test of every program as graded, since stopping early already decides the program.

    python benchmarks/sandbox_throughput.py            # as root (the sandbox needs it); ~1 min on 2 cores
    python benchmarks/sandbox_throughput.py --programs 50 --workers 4

The last line is ``RESULT sandbox_throughput value=<graded tests/s ratio, stop-first / run-all> target>=2.0``.
"""

from __future__ import annotations

import argparse
import random
import time
import zlib
from collections import Counter

from trl_multiagent.tasks.sandbox import Outcome, SandboxPool, TestSuite
from trl_multiagent.tasks.toy_code import PROBLEMS, make_toy_code_problem

BLOCK = 50  # programs per timing block
TARGET_RATIO = 2.0  # with ~80% failing programs whose first failure comes early, most test runs are skipped


def _failing_variant(rng: random.Random, solution: str, suite: TestSuite) -> str:
    """The reference program with a bug that fires on some inputs (chosen by a hash of the input)."""
    for _ in range(100):
        salt, modulus = rng.randrange(10**6), rng.choice((2, 3, 4))
        fires = [zlib.crc32(f"{salt}{case.input}".encode()) % modulus == 0 for case in suite.cases]
        if any(fires):
            break
    bug = rng.choice(("wrong", "wrong", "crash", "always"))
    if bug == "always":
        return "import sys\nsys.stdin.read()\nprint('no idea')"
    action = "print('bug')" if bug == "wrong" else "raise RuntimeError('bug')"
    return (
        "import io, sys, zlib\n"
        "data = sys.stdin.read()\n"
        f"if zlib.crc32(({str(salt)!r} + data).encode()) % {modulus} == 0:\n"
        f"    {action}\n"
        "else:\n"
        "    sys.stdin = io.StringIO(data)\n" + "".join(f"    {line}\n" for line in solution.splitlines())
    )


def make_programs(n: int, failing: float, num_tests: int, seed: int) -> list[tuple[str, TestSuite, bool]]:
    rng = random.Random(seed)
    kinds = sorted(PROBLEMS)
    programs = []
    for i in range(n):
        _, suite, solution = make_toy_code_problem(rng, kinds[i % len(kinds)], num_tests)
        fails = i < round(n * failing)
        programs.append((_failing_variant(rng, solution, suite) if fails else solution, suite, not fails))
    rng.shuffle(programs)
    return programs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--failing", type=float, default=0.8, help="share of programs that fail some test")
    parser.add_argument("--tests", type=int, default=10, help="tests per program")
    parser.add_argument("--workers", type=int, default=None, help="sandboxes at a time (default: CPU count)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    programs = make_programs(args.programs, args.failing, args.tests, args.seed)
    problems = [(source, suite) for source, suite, _ in programs]
    total_tests = sum(len(suite.cases) for _, suite in problems)
    modes = {"run all tests": False, "stop at first failure": True}
    walls = dict.fromkeys(modes, 0.0)
    reports: dict[str, list] = {label: [] for label in modes}
    with SandboxPool(max_workers=args.workers) as pool:
        pool.run(problems[:2])  # warm the page cache so the first mode isn't charged for it
        # Alternate the modes block by block (ABBA...), so drift in machine speed hits both modes alike.
        for b, start in enumerate(range(0, len(problems), BLOCK)):
            block = problems[start : start + BLOCK]
            for label in list(modes)[:: 1 if b % 2 == 0 else -1]:
                began = time.perf_counter()
                reports[label] += pool.run(block, stop_at_first_failure=modes[label])
                walls[label] += time.perf_counter() - began
        workers = pool.max_workers
    rows, verdicts = [], {}
    for label in modes:
        executed = sum(r.executed for r in reports[label])
        verdicts[label] = [r.outcome is Outcome.PASSED for r in reports[label]]
        outcomes = Counter(r.outcome.value for r in reports[label])
        wall = walls[label]
        rows.append((label, len(reports[label]), executed, wall, executed / wall, total_tests / wall, outcomes))

    expected = [passes for _, _, passes in programs]
    if verdicts["run all tests"] != expected or verdicts["stop at first failure"] != expected:
        raise SystemExit("Grading disagrees with the generated programs' known verdicts; the benchmark is invalid.")
    ratio = rows[1][5] / rows[0][5]
    print(f"{args.programs} programs x {args.tests} tests, {args.failing:.0%} failing, {workers} workers")
    print(
        f"{'mode':<24}{'programs':>9}{'tests run':>10}{'wall s':>8}{'tests run/s':>12}{'graded tests/s':>15}  outcomes"
    )
    for label, n, executed, wall, run_rate, graded_rate, outcomes in rows:
        print(f"{label:<24}{n:>9}{executed:>10}{wall:>8.1f}{run_rate:>12.1f}{graded_rate:>15.1f}  {dict(outcomes)}")
    print(f"{'ratio (stop / all)':<24}{'':>9}{rows[1][2] / rows[0][2]:>10.2f}{'':>8}{'':>12}{ratio:>15.2f}")
    print(f"RESULT sandbox_throughput value={ratio:.2f} target>={TARGET_RATIO}")


if __name__ == "__main__":
    main()
