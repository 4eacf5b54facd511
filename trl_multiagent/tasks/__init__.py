"""Tasks and rewards: datasets as TRL rows (a conversational ``prompt`` plus ground truth) and their rewards.

- math: DAPO-Math-17K (``answer``), graded by ``math_reward`` (last ``\\boxed{}``, math-verify equivalence);
- code: DeepCoder PrimeIntellect (``tests``), graded by ``CodeReward`` in the sandbox (``sandbox.py``);
- offline generators with the same columns for CPU runs: ``make_arithmetic_dataset``, ``make_toy_code_dataset``.
"""

from .arithmetic import make_arithmetic_dataset
from .code import DEEPCODER_ID, CodeReward, extract_code, load_deepcoder
from .math import DAPO_MATH_ID, extract_boxed, load_dapo_math, math_reward
from .sandbox import Outcome, SandboxLimits, SandboxPool, TestCase, TestReport, TestSuite, execute, run_tests
from .toy_code import make_toy_code_dataset

__all__ = [
    "DAPO_MATH_ID",
    "DEEPCODER_ID",
    "CodeReward",
    "Outcome",
    "SandboxLimits",
    "SandboxPool",
    "TestCase",
    "TestReport",
    "TestSuite",
    "execute",
    "extract_boxed",
    "extract_code",
    "load_dapo_math",
    "load_deepcoder",
    "make_arithmetic_dataset",
    "make_toy_code_dataset",
    "math_reward",
    "run_tests",
]
