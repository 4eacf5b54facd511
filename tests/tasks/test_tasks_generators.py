"""Offline task generators (arithmetic word problems, toy code problems) and the sandbox benchmark smoke run."""

import random
import re
import sys

import pytest
from harness import ROOT, needs_sandbox, run_offline

from trl_multiagent.tasks import make_arithmetic_dataset, make_toy_code_dataset, math_reward
from trl_multiagent.tasks.code import CodeReward
from trl_multiagent.tasks.math import MATH_INSTRUCTION
from trl_multiagent.tasks.sandbox import TestSuite
from trl_multiagent.tasks.toy_code import PROBLEMS, make_toy_code_problem


def evaluate_word_problem(text: str) -> int:
    """An independent reading of the generated sentences, to check the stored answers."""
    total = int(re.search(r"has (\d+)", text).group(1))
    for sentence in text.split(". ")[1:]:
        if m := re.search(r"gets (\d+) more", sentence):
            total += int(m.group(1))
        elif m := re.search(r"gives away (\d+)", sentence):
            total -= int(m.group(1))
        elif m := re.search(r"becomes (\d+) times", sentence):
            total *= int(m.group(1))
        elif m := re.search(r"among (\d+) people", sentence):
            assert total % int(m.group(1)) == 0
            total //= int(m.group(1))
    return total


def test_arithmetic_dataset_rows_are_exact_small_and_reproducible():
    data = make_arithmetic_dataset(200, seed=3)
    assert data.column_names == ["prompt", "answer"] and len(data) == 200
    assert list(data["answer"]) == list(make_arithmetic_dataset(200, seed=3)["answer"])
    assert list(data["answer"]) != list(make_arithmetic_dataset(200, seed=4)["answer"])
    for row in data:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(MATH_INSTRUCTION)
        problem = message["content"].removesuffix(MATH_INSTRUCTION)
        assert 1 <= len(re.findall(r"\bThen\b", problem)) <= 2  # one or two operations
        assert int(row["answer"]) == evaluate_word_problem(problem) >= 0
        assert all(int(n) <= 80 for n in re.findall(r"\d+", problem))  # small numbers for a toy model


def test_arithmetic_answers_are_graded_by_the_math_reward():
    data = make_arithmetic_dataset(5, seed=0, max_operations=1)
    completions = [f"So the answer is \\boxed{{{a}}}." for a in data["answer"]]
    assert math_reward(completions, list(data["answer"])) == [1.0] * 5
    assert math_reward(["no box"] * 5, list(data["answer"])) == [0.0] * 5


def test_generators_reject_bad_sizes():
    with pytest.raises(ValueError, match="n >= 0"):
        make_arithmetic_dataset(-1)
    with pytest.raises(ValueError, match="num_tests >= 1"):
        make_toy_code_dataset(3, num_tests=0)


def test_toy_code_rows_have_the_code_task_columns():
    data = make_toy_code_dataset(30, seed=1, num_tests=4)
    assert data.column_names == ["prompt", "tests", "solution"]
    for row in data:
        suite = TestSuite.from_json(row["tests"])
        assert suite.kind == "stdin_stdout" and len(suite.cases) == 4
        assert row["prompt"][0]["role"] == "user" and "standard input" in row["prompt"][0]["content"]


@needs_sandbox
def test_every_toy_problem_kind_is_solved_by_its_reference_and_failed_by_a_wrong_program():
    rng = random.Random(0)
    problems = [make_toy_code_problem(rng, kind, num_tests=3) for kind in sorted(PROBLEMS)]
    tests = [suite.to_json() for _, suite, _ in problems]
    completions = [f"```python\n{solution}\n```" for _, _, solution in problems]
    reward = CodeReward(max_workers=2)
    assert reward(completions, tests) == [1.0] * len(problems)
    assert reward(["```python\nprint(42)\n```"] * len(problems), tests) == [0.0] * len(problems)


@pytest.mark.slow
@needs_sandbox
def test_benchmark_smoke_run_prints_the_result_line():
    script = ROOT / "benchmarks" / "sandbox_throughput.py"
    args = ["--programs", "10", "--tests", "3", "--workers", "2"]
    done = run_offline([sys.executable, str(script), *args], cwd=ROOT, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert lines[-2].startswith("ratio (stop / all)")
    assert re.fullmatch(r"RESULT sandbox_throughput value=\d+\.\d+ target>=\d+(\.\d+)?", lines[-1])
