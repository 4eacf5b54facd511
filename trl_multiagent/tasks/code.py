"""Code task: DeepCoder (PrimeIntellect) rows, the last ```python block of an answer, and a test-passing reward.

Rows: ``prompt`` = one user message holding the problem in a layout (``problem_layout``) and ``tests`` = the
``TestSuite`` JSON text (see ``sandbox.TestSuite``):
``{"kind": "stdin_stdout" | "function_call", "fn_name": str | null, "cases": [{"input": ..., "output": ...}],
"prelude": true}``. stdin_stdout cases hold stdin text and expected stdout; function_call cases hold the positional
arguments and the expected return value (DeepCoder's one-element ``output`` wrapper removed). ``prelude``: every
program runs after the import prelude LeetCode-style graders put before a solution (``sandbox.PRELUDE_SOURCE``), as
the paper's grader does for every DeepCoder source and test kind.

Problem layouts: ``"livecodebench"`` (the paper's) is LiveCodeBench's layout, which the reference builds for every
DeepCoder row (examples/deepcoder/prepare_deepcoder_data.py:58-60, rllm/data/utils.py:66-76): a statement of the job,
a blank line, the problem, a format line over a python block holding the row's starter code (lcbv5 rows have some;
PrimeIntellect rows have none, so theirs say to read standard input and hold a placeholder), and an answer line; its
sentences, in this library's words, are in ``livecodebench_layout.json`` (another file with the same keys may be given
instead). ``"instruction"``: the problem, then one sentence of ours saying how the program is run (a function to
write, or standard input to read), which the toy code task uses too.

The reward runs the extracted program in the sandbox: ``all_pass`` (the paper's: 1.0 only if every test passes,
stopping at the first failure) or ``fraction`` (share of tests passed, all tests run).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from datasets import Dataset

from ..common.parse_rules import last_code_block
from .math import completion_text
from .rows import check_split, field, published_rows, take
from .sandbox import ProblemTime, SandboxLimits, SandboxPool, TestCase, TestSuite

DEEPCODER_ID = "agentica-org/DeepCoder-Preview-Dataset"
DEEPCODER_CONFIG = "primeintellect"
# The paper shuffles PrimeIntellect with seed 42 and holds out the first 1,000 problems as its validation split.
TEST_ROWS, SPLIT_SEED = 1000, 42
PROBLEM_LAYOUTS = ("livecodebench", "instruction")
PAPER_PROBLEM_TIME = ProblemTime()  # the paper's grader's time for a problem's tests together
LIVECODEBENCH_LAYOUT = Path(__file__).with_name("livecodebench_layout.json")


@dataclass(frozen=True)
class ProblemLayout:
    """The sentences of LiveCodeBench's problem layout (``render`` puts them in place); read from a JSON file whose
    ``code_problem`` section holds them (``livecodebench_layout.json``)."""

    system: str  # what the job is, before the problem
    format_with_starter_code: str  # the format line over the row's starter code
    format_without_starter_code: str  # the format line over the placeholder, when the row has no starter code
    code_placeholder: str  # the python block's content without starter code
    answer: str  # the last line

    def render(self, problem: str, starter_code: str | None = None) -> str:
        """The user message of ``problem``: laid out as the reference lays it out, the problem as it is (nothing
        between it and the format line), the starter code, when there is some, in the python block."""
        if starter_code:
            code, form = starter_code, self.format_with_starter_code
        else:
            code, form = self.code_placeholder, self.format_without_starter_code
        return f"{self.system}\n\n{problem}{form}\n```python\n{code}\n```\n\n{self.answer}\n\n"

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> ProblemLayout:
        with open(path, encoding="utf-8") as file:
            section = json.load(file).get("code_problem")
        names = [f.name for f in fields(cls)]
        if not isinstance(section, dict) or not all(isinstance(section.get(name), str) for name in names):
            raise ValueError(f"{path}: a problem layout file needs a 'code_problem' object with the texts {names}.")
        return cls(**{name: section[name] for name in names})


def read_problem_layout(layout: str | os.PathLike) -> ProblemLayout | None:
    """``"livecodebench"``: the shipped layout; ``"instruction"``: None (``code_prompt``); else the layout file at
    ``layout``."""
    if layout == "livecodebench":
        return ProblemLayout.from_json(LIVECODEBENCH_LAYOUT)
    if layout == "instruction":
        return None
    if os.path.isfile(layout):
        return ProblemLayout.from_json(layout)
    raise ValueError(
        f"Unknown problem layout {layout!r}: use one of {PROBLEM_LAYOUTS} or the path of a JSON file laid out like "
        f"{LIVECODEBENCH_LAYOUT.name}."
    )


def code_instruction(suite: TestSuite) -> str:
    """How the program is run, appended to the problem so the model writes the form the tests call."""
    if suite.kind == "function_call":
        return (
            f"Write your solution as a Python function `{suite.fn_name}` (at module level or as a method of "
            "`class Solution`): it is called with each test's arguments and its return value is checked. Give the "
            "code in a single ```python code block."
        )
    return (
        "Write a complete Python program that reads the input from standard input and prints the answer to "
        "standard output. Give the code in a single ```python code block."
    )


def code_prompt(problem: str, suite: TestSuite) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{problem.strip()}\n\n{code_instruction(suite)}"}]


def suite_from_deepcoder(tests: Any, where: str, fn_name: str | None = None) -> TestSuite:
    """A DeepCoder ``tests`` value (JSON text or decoded) as a TestSuite; ``where`` names the row in errors.

    Accepts every config's encoding: PrimeIntellect's list (``type`` stdin_stdout / function_call, ``fn_name`` in
    each test), lcbv5's list (``testtype`` stdin / functional; pass the row's ``metadata.func_name`` as
    ``fn_name``), codeforces' untyped list (stdin) and TACO's ``{"inputs", "outputs", "fn_name"?}`` dict. The
    suite asks for the grader's import prelude (``TestSuite.prelude``), whatever the encoding.
    """
    try:
        data = json.loads(tests) if isinstance(tests, str) else tests
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: 'tests' is not valid JSON ({e}); it must be DeepCoder's JSON test list.") from e
    if isinstance(data, dict):  # TACO: {"inputs": [...], "outputs": [...], "fn_name"?}
        fn = data.get("fn_name")
        outputs = [o[0] if fn and isinstance(o, list) and len(o) == 1 else o for o in data.get("outputs", [])]
        data = [{"input": i, "output": o, "fn_name": fn} for i, o in zip(data.get("inputs", []), outputs, strict=True)]
        data = [{**t, "type": "function_call" if fn else "stdin_stdout"} for t in data]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{where}: 'tests' must be a non-empty JSON list of tests, got {str(tests)[:100]!r}.")
    for j, test in enumerate(data):
        missing = [key for key in ("input", "output") if not isinstance(test, dict) or key not in test]
        if missing:
            raise ValueError(f"{where}: test {j} of 'tests' has no {missing[0]!r}; every test needs input and output.")
    first = data[0]
    kind = first.get("type") or {"functional": "function_call"}.get(first.get("testtype"), "stdin_stdout")
    if kind != "function_call":
        cases = tuple(TestCase(str(t["input"]), str(t["output"])) for t in data)
        return TestSuite("stdin_stdout", cases, prelude=True)
    fn_name = first.get("fn_name") or fn_name
    if not fn_name:
        raise ValueError(f"{where}: function_call tests need 'fn_name' (the function to call); it is missing.")
    cases = []
    for t in data:
        args, expected = t["input"], t["output"]
        if "testtype" in t:  # lcbv5: one JSON value per line for the arguments, the return value as JSON text
            args, expected = [json.loads(line) for line in args.splitlines() if line.strip()], json.loads(expected)
        elif isinstance(expected, list) and len(expected) == 1:  # PrimeIntellect wraps the return value
            expected = expected[0]
        cases.append(TestCase(list(args), expected))
    return TestSuite("function_call", tuple(cases), fn_name=fn_name, prelude=True)


def _deepcoder_row(
    row: dict[str, Any], index: int, source: str, layout: ProblemLayout | None = None
) -> dict[str, Any]:
    problem = field(row, index, source, "problem")
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}  # lcbv5 rows only
    suite = suite_from_deepcoder(
        field(row, index, source, "tests"), f"{source}: row {index}", metadata.get("func_name")
    )
    if layout is None:
        return {"prompt": code_prompt(problem, suite), "tests": suite.to_json()}
    prompt = [{"role": "user", "content": layout.render(problem, row.get("starter_code"))}]
    return {"prompt": prompt, "tests": suite.to_json()}


def load_deepcoder(
    split: str = "train",
    path_or_id: str = DEEPCODER_ID,
    limit: int | None = None,
    problem_layout: str | os.PathLike = "livecodebench",
    bad_rows: str = "stop",
) -> Dataset:
    """DeepCoder PrimeIntellect as TRL rows (``prompt``, ``tests``), split like the paper.

    ``test`` = the first ``min(1000, max(1, n // 10))`` rows after a seed-42 shuffle (exactly the paper's 1,000
    on the full data; a tenth of a small local file). The paper also drops tests its grader failed on, using a file
    it did not publish; all tests are kept here. ``problem_layout``: ``"livecodebench"`` (the paper's),
    ``"instruction"`` or a layout file (module docstring). ``bad_rows``: what a row that cannot be read does
    (``rows.published_rows``): "stop" or "skip".
    """
    check_split(split)
    layout = read_problem_layout(problem_layout)
    rows, _ = published_rows(
        path_or_id,
        hub_id=DEEPCODER_ID,
        hub_config=DEEPCODER_CONFIG,
        to_row=_deepcoder_row,
        bad_rows=bad_rows,
        layout=layout,
    )
    rows = rows.select_columns(["prompt", "tests"]).shuffle(seed=SPLIT_SEED)
    n_test = min(TEST_ROWS, max(1, len(rows) // 10))
    part = rows.select(range(n_test)) if split == "test" else rows.select(range(n_test, len(rows)))
    return take(part, limit)


def extract_code(text: str) -> str | None:
    """The last complete ```python (or untagged) block after any ``</think>``; None when there is none.

    ``parse_rules.last_code_block``: one rule for the reward, the workflows and the metrics.
    """
    return last_code_block(text)


class CodeReward:
    """TRL reward that runs each completion's program on its row's ``tests`` in the sandbox.

    ``mode="all_pass"`` (default, the paper's): 1.0 if every test passes, else 0.0; grading stops at the first
    failing test. ``mode="fraction"``: passed / total, running every test. No code block scores 0.0.
    ``problem_time``: the time a program may take on a problem's tests together (default the paper's grader's,
    min(4 x tests + 5, 120) seconds; ``sandbox.ProblemTime``), None for no budget beyond each test's limits.
    Picklable: the worker pool is created on first use in each process.
    """

    scores_each_episode = True  # running programs takes time: the trainer starts it as each episode ends

    def __init__(
        self,
        mode: Literal["all_pass", "fraction"] = "all_pass",
        max_workers: int | None = None,
        limits: SandboxLimits | None = None,
        problem_time: ProblemTime | None = PAPER_PROBLEM_TIME,
    ) -> None:
        if mode not in ("all_pass", "fraction"):
            raise ValueError(f"CodeReward mode must be 'all_pass' or 'fraction', got {mode!r}.")
        self.mode = mode
        self.max_workers = max_workers
        self.limits = limits or SandboxLimits()
        self.problem_time = problem_time
        self.__name__ = "code_reward" if mode == "all_pass" else "code_reward_fraction"
        self._pool: SandboxPool | None = None

    def __call__(self, completions: list, tests: list[str], **kwargs: Any) -> list[float]:
        sources = [extract_code(completion_text(c)) for c in completions]
        graded = [i for i, source in enumerate(sources) if source is not None]
        if self._pool is None:
            self._pool = SandboxPool(self.max_workers, self.limits, self.problem_time)
        problems = [(sources[i], TestSuite.from_json(tests[i])) for i in graded]
        reports = self._pool.run(problems, stop_at_first_failure=self.mode == "all_pass")
        rewards = [0.0] * len(completions)
        for i, report in zip(graded, reports, strict=True):
            rewards[i] = (
                report.passed / report.total if self.mode == "fraction" else float(report.passed == report.total)
            )
        return rewards

    def check_row(self, row: dict[str, Any]) -> str | None:
        """Why this reward cannot grade ``row`` (its `tests` are not a test suite), or None; the trainer asks it of
        every training row before the first step (`bad_rows`)."""
        try:
            TestSuite.from_json(row["tests"])
        except (ValueError, KeyError, TypeError, AttributeError) as error:  # a JSONDecodeError is a ValueError
            return f"its 'tests' are not a test suite ({type(error).__name__}: {str(error)[:200]})"
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}  # threads don't pickle; each process starts its own pool
