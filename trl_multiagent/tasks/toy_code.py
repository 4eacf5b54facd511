"""Offline tiny coding problems with stdin/stdout tests, for CPU runs, tests and the sandbox benchmark.

Rows have the code task's columns (``prompt``, ``tests`` as ``TestSuite`` JSON) plus ``solution``: a reference
program that passes every test (not used by the reward; handy for checks and warm-up data).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from datasets import Dataset

from .code import code_prompt
from .sandbox import TestCase, TestSuite


@dataclass(frozen=True)
class ToyProblem:
    statement: str  # may hold ``{k}``, the problem's constant
    make_input: Callable[[random.Random], str]
    solve: Callable[[str, int], str]  # (stdin, k) -> the expected stdout, computed here rather than in a sandbox
    solution: str  # the same logic as a program; may hold ``{k}``


def _ints(rng: random.Random, k: int, lo: int = -50, hi: int = 50) -> str:
    return " ".join(str(rng.randint(lo, hi)) for _ in range(k))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeiou") for _ in range(rng.randint(2, 8)))


def _list_input(rng: random.Random) -> str:
    n = rng.randint(2, 6)
    return f"{n}\n{_ints(rng, n)}\n"


def _numbers(stdin: str) -> list[int]:
    return list(map(int, stdin.split("\n")[1].split()))


# Ten kinds of one- or two-line programs; four take a constant k (2 to 9) that the statement states and the program
# must copy, so a problem is its kind and its k (38 statements in all) plus its random tests.
PROBLEMS = {
    "sum_two": ToyProblem(
        "Read two integers a and b from one line and print a + b.",
        lambda rng: _ints(rng, 2) + "\n",
        lambda s, k: str(sum(map(int, s.split()))),
        "a, b = map(int, input().split())\nprint(a + b)",
    ),
    "max_list": ToyProblem(
        "The first line holds n, the second n integers. Print the largest of them.",
        _list_input,
        lambda s, k: str(max(_numbers(s))),
        "n = int(input())\nprint(max(map(int, input().split())))",
    ),
    "sum_plus_k": ToyProblem(
        "The first line holds n, the second n integers. Print their sum plus {k}.",
        _list_input,
        lambda s, k: str(sum(_numbers(s)) + k),
        "n = int(input())\nprint(sum(map(int, input().split())) + {k})",
    ),
    "reverse": ToyProblem(
        "Read one word and print it reversed.",
        lambda rng: _word(rng) + "\n",
        lambda s, k: s.strip()[::-1],
        "print(input().strip()[::-1])",
    ),
    "repeat_k": ToyProblem(
        "Read one word and print it {k} times in a row on one line.",
        lambda rng: _word(rng) + "\n",
        lambda s, k: s.strip() * k,
        "print(input().strip() * {k})",
    ),
    "vowels": ToyProblem(
        "Read one lowercase word and print how many of its letters are vowels (a, e, i, o, u).",
        lambda rng: _word(rng) + "\n",
        lambda s, k: str(sum(c in "aeiou" for c in s.strip())),
        "print(sum(c in 'aeiou' for c in input().strip()))",
    ),
    "parity": ToyProblem(
        "Read an integer and print even if it is even, odd otherwise.",
        lambda rng: _ints(rng, 1) + "\n",
        lambda s, k: "even" if int(s) % 2 == 0 else "odd",
        "print('even' if int(input()) % 2 == 0 else 'odd')",
    ),
    "count_up": ToyProblem(
        "Read a positive integer n and print the sum 1 + 2 + ... + n.",
        lambda rng: f"{rng.randint(2, 30)}\n",
        lambda s, k: str(int(s) * (int(s) + 1) // 2),
        "n = int(input())\nprint(n * (n + 1) // 2)",
    ),
    "times_k": ToyProblem(
        "Read an integer n and print n times {k}.",
        lambda rng: f"{rng.randint(2, 60)}\n",
        lambda s, k: str(int(s) * k),
        "print(int(input()) * {k})",
    ),
    "remainder_k": ToyProblem(
        "Read a positive integer n and print the remainder of n divided by {k}.",
        lambda rng: f"{rng.randint(10, 99)}\n",
        lambda s, k: str(int(s) % k),
        "print(int(input()) % {k})",
    ),
}
CONSTANTS = range(2, 10)  # the k of the kinds whose statement holds one


def make_toy_code_problem(
    rng: random.Random, kind: str, num_tests: int = 5, k: int | None = None
) -> tuple[str, TestSuite, str]:
    """(statement, tests, reference solution) of one ``kind`` from ``PROBLEMS`` with ``num_tests`` random cases;
    ``k`` is drawn from ``CONSTANTS`` unless given (kinds without a constant ignore it)."""
    problem = PROBLEMS[kind]
    k = rng.choice(CONSTANTS) if k is None else k
    inputs = [problem.make_input(rng) for _ in range(num_tests)]
    suite = TestSuite("stdin_stdout", tuple(TestCase(i, problem.solve(i, k) + "\n") for i in inputs))
    return problem.statement.format(k=k), suite, problem.solution.format(k=k)


def make_toy_code_dataset(n: int, seed: int = 0, num_tests: int = 5) -> Dataset:
    """``n`` tiny stdin/stdout problems as TRL rows: ``prompt``, ``tests`` (TestSuite JSON), ``solution``."""
    if n < 0 or num_tests < 1:
        raise ValueError(f"Need n >= 0 and num_tests >= 1, got n={n}, num_tests={num_tests}.")
    rng = random.Random(seed)
    kinds = sorted(PROBLEMS)
    rows = [make_toy_code_problem(rng, rng.choice(kinds), num_tests) for _ in range(n)]
    return Dataset.from_dict(
        {
            "prompt": [code_prompt(statement, suite) for statement, suite, _ in rows],
            "tests": [suite.to_json() for _, suite, _ in rows],
            "solution": [solution for _, _, solution in rows],
        }
    )
