"""Tasks and rewards: datasets as TRL rows (a conversational ``prompt`` plus ground truth) and their rewards.

- ``TASKS`` / ``get_task(name)`` (``registry.py``): the one registry, name -> dataset loader, offline generator,
  reward, training and evaluation lengths, read by the recipes, the CLI and the evaluators;
- math: DAPO-Math-17K (``answer``), graded by ``math_reward`` (last ``\\boxed{}``, math-verify equivalence);
- code: DeepCoder PrimeIntellect (``tests``), graded by ``CodeReward`` in the sandbox (``sandbox.py``);
- code evaluator verdicts judged against test outcomes: ``check_verdicts`` (Eval-Opt's verdict accuracy);
- offline generators with the same columns for CPU runs: ``make_arithmetic_dataset``, ``make_toy_code_dataset``, and
  ``make_mod_search_dataset`` (math columns; easy to check, hard to answer in one pass).
"""

from .arithmetic import make_arithmetic_dataset
from .code import DEEPCODER_ID, CodeReward, extract_code, load_deepcoder
from .math import DAPO_MATH_ID, extract_boxed, load_dapo_math, math_answer_checker, math_reward
from .mod_search import ModSearchProblem, make_mod_search_dataset
from .registry import TASKS, Task, get_task
from .sandbox import Outcome, SandboxLimits, SandboxPool, TestCase, TestReport, TestSuite, execute, run_tests
from .toy_code import make_toy_code_dataset
from .verdicts import VerdictCheck, check_verdicts

__all__ = [
    "DAPO_MATH_ID",
    "DEEPCODER_ID",
    "CodeReward",
    "ModSearchProblem",
    "Outcome",
    "SandboxLimits",
    "SandboxPool",
    "TASKS",
    "Task",
    "TestCase",
    "TestReport",
    "TestSuite",
    "VerdictCheck",
    "check_verdicts",
    "execute",
    "extract_boxed",
    "extract_code",
    "get_task",
    "load_dapo_math",
    "load_deepcoder",
    "make_arithmetic_dataset",
    "make_mod_search_dataset",
    "make_toy_code_dataset",
    "math_answer_checker",
    "math_reward",
    "run_tests",
]
