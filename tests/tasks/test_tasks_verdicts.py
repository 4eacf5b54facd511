"""Evaluator verdicts on code judged against the sandbox's test outcomes, on toy code problems."""

import asyncio
import random

import pytest
from harness import needs_sandbox

from trl_multiagent.tasks import SandboxLimits, SandboxPool, VerdictCheck, check_verdicts
from trl_multiagent.tasks.toy_code import make_toy_code_problem
from trl_multiagent.workflows import EvalOpt

_, SUITE, CORRECT = make_toy_code_problem(random.Random(0), "sum_two", num_tests=3)
TESTS = SUITE.to_json()
WRONG = "a, b = map(int, input().split())\nprint(a - b)"
CORRECT_ANSWER, WRONG_ANSWER = (f"My program:\n```python\n{code}\n```" for code in (CORRECT, WRONG))
SAYS_CORRECT = "It adds the two numbers as asked. \\boxed{Correct}"
SAYS_INCORRECT = "It subtracts instead of adding. \\boxed{Incorrect}"


@needs_sandbox
def test_each_verdict_is_right_iff_it_matches_the_test_outcome():
    verdicts = [SAYS_CORRECT, SAYS_INCORRECT, SAYS_CORRECT, SAYS_INCORRECT]
    solutions = [CORRECT_ANSWER, CORRECT_ANSWER, WRONG_ANSWER, WRONG_ANSWER]
    checks = check_verdicts(verdicts, solutions, TESTS)
    assert checks == [
        VerdictCheck(said_correct=True, passed=True),
        VerdictCheck(said_correct=False, passed=True),
        VerdictCheck(said_correct=True, passed=False),
        VerdictCheck(said_correct=False, passed=False),
    ]
    assert [check.right for check in checks] == [True, False, False, True]


@needs_sandbox
def test_no_verdict_counts_as_incorrect_and_no_code_as_failing():
    """Eval-Opt retries on an unparseable verdict; a program-less answer scores 0 like CodeReward's."""
    verdicts = ["Looks fine to me.", "Looks fine to me.", SAYS_CORRECT, SAYS_INCORRECT]
    solutions = [CORRECT_ANSWER, WRONG_ANSWER, "I could not solve it.", "The answer is a + b."]
    checks = check_verdicts(verdicts, solutions, TESTS)
    assert [(c.said_correct, c.passed, c.right) for c in checks] == [
        (None, True, False),
        (None, False, True),
        (True, False, False),
        (False, False, True),
    ]


@needs_sandbox
def test_an_eval_opt_episode_checked_through_a_pool():
    """The generator/evaluator outputs of a real Eval-Opt run, paired as the workflow pairs them."""
    replies = {"generator": [WRONG_ANSWER, CORRECT_ANSWER], "evaluator": [SAYS_INCORRECT, SAYS_INCORRECT]}
    outputs = {"generator": [], "evaluator": []}

    async def generate(role, messages, *, instance=0):
        outputs[role].append(replies[role][len(outputs[role])])
        return outputs[role][-1]

    prompt = [{"role": "user", "content": "Read two integers a and b from one line and print a + b."}]
    asyncio.run(EvalOpt(max_iterations=2, task="code").run(prompt, generate))
    with SandboxPool(max_workers=2, limits=SandboxLimits(cpu_seconds=2, wall_seconds=4)) as pool:
        checks = check_verdicts(outputs["evaluator"], outputs["generator"], TESTS, pool=pool)
    # The first rejection was right (the program subtracts); the second rejected a passing program.
    assert checks == [VerdictCheck(said_correct=False, passed=False), VerdictCheck(said_correct=False, passed=True)]
    assert [check.right for check in checks] == [True, False]


def test_verdicts_and_solutions_must_pair_up():
    with pytest.raises(ValueError, match="2 verdicts for 1 solutions"):
        check_verdicts([SAYS_CORRECT, SAYS_INCORRECT], [CORRECT_ANSWER], TESTS)
