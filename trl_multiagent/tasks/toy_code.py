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
    statement: str
    make_input: Callable[[random.Random], str]
    solve: Callable[[str], str]  # the expected stdout for an input, computed here rather than in a sandbox
    solution: str  # the same logic as a program


def _ints(rng: random.Random, k: int, lo: int = -50, hi: int = 50) -> str:
    return " ".join(str(rng.randint(lo, hi)) for _ in range(k))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeiou") for _ in range(rng.randint(1, 8)))


def _list_input(rng: random.Random) -> str:
    n = rng.randint(1, 6)
    return f"{n}\n{_ints(rng, n)}\n"


PROBLEMS = {
    "sum_two": ToyProblem(
        "Read two integers a and b from one line and print a + b.",
        lambda rng: _ints(rng, 2) + "\n",
        lambda s: str(sum(map(int, s.split()))),
        "a, b = map(int, input().split())\nprint(a + b)",
    ),
    "max_list": ToyProblem(
        "The first line holds n, the second n integers. Print the largest of them.",
        _list_input,
        lambda s: str(max(map(int, s.split("\n")[1].split()))),
        "n = int(input())\nprint(max(map(int, input().split())))",
    ),
    "reverse": ToyProblem(
        "Read one word and print it reversed.",
        lambda rng: _word(rng) + "\n",
        lambda s: s.strip()[::-1],
        "print(input().strip()[::-1])",
    ),
    "vowels": ToyProblem(
        "Read one lowercase word and print how many of its letters are vowels (a, e, i, o, u).",
        lambda rng: _word(rng) + "\n",
        lambda s: str(sum(c in "aeiou" for c in s.strip())),
        "print(sum(c in 'aeiou' for c in input().strip()))",
    ),
    "parity": ToyProblem(
        "Read an integer and print even if it is even, odd otherwise.",
        lambda rng: _ints(rng, 1) + "\n",
        lambda s: "even" if int(s) % 2 == 0 else "odd",
        "print('even' if int(input()) % 2 == 0 else 'odd')",
    ),
    "count_up": ToyProblem(
        "Read a positive integer n and print the sum 1 + 2 + ... + n.",
        lambda rng: f"{rng.randint(1, 30)}\n",
        lambda s: str(int(s) * (int(s) + 1) // 2),
        "n = int(input())\nprint(n * (n + 1) // 2)",
    ),
}


def make_toy_code_problem(rng: random.Random, kind: str, num_tests: int = 5) -> tuple[str, TestSuite, str]:
    """(statement, tests, reference solution) of one ``kind`` from ``PROBLEMS`` with ``num_tests`` random cases."""
    problem = PROBLEMS[kind]
    inputs = [problem.make_input(rng) for _ in range(num_tests)]
    suite = TestSuite("stdin_stdout", tuple(TestCase(i, problem.solve(i) + "\n") for i in inputs))
    return problem.statement, suite, problem.solution


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
