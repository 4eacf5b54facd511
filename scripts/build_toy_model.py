r"""Build the shipped toy model: a small Qwen3 that plays every built-in role on arithmetic and toy_code problems.

    python scripts/build_toy_model.py                    # writes trl_multiagent/toy/model/ (seeded)

CPU time: about 100 CPU minutes on one core of the 2-core machines this repo is developed on (`--threads 1`), 98
of them the 2,600 training steps (measured while other jobs shared the machine), the rest transcripts and tokenizer;
the final check adds a few minutes.

A randomly initialised model cannot follow role prompts, so RL on it learns nothing. This script makes a model that
can, by supervised learning on transcripts of the real workflows:

1. Transcripts. Each built-in workflow's real ``run()`` (SingleAgent, EvalOpt, Voting, OrchWorkers) runs on
   synthetic arithmetic problems and on toy_code problems (``trl_multiagent.tasks.toy_code``) with a scripted
   ``generate`` that writes each role's target text, and every call is kept as a (messages, target) pair. The
   targets are short and deliberately imperfect, so RL has room:
   - arithmetic solvers (generator, voters, workers) write one line per operation, ``12 + 5 = 17. 17 * 2 = 34.
     \boxed{34}``, with per-operation error rates; on "gives away", "times as large" and "shares equally" the
     most frequent step in the data is the wrong one (the confused operation), so even greedy decoding misses;
   - code solvers write the kind's program in a ```python block, or one of its typical bugs (``CODE_BUGS``: a wrong
     operator, an off-by-one, a missing int conversion); on four of the ten kinds the bug is the mode;
   - the evaluator cites each step with its sentence's verb (code: quotes each line) and names the first wrong one
     or says each checks out, right ``JUDGE_ACCURACY`` of the time; a program is right when it passes its tests;
   - the aggregator and synthesizer check the candidates the same way, in order, and pick a correct one when there
     is one, ``JUDGE_ACCURACY`` of the time: verifying with citations is what lets the judges start above chance
     (the code synthesizer then repeats the picked program);
   - the orchestrator writes three ``STRATEGY k:`` lines drawn from a fixed pool, never an answer;
   - with ``--search_problems N`` (default 0: the shipped model has none), the math workflows also run on mod_search
     problems (``trl_multiagent.tasks.mod_search``): a first attempt checks a uniform candidate, a retry writes the
     tried and the untried candidates and checks the first untried one (``Tried 7, 4. Left 12, 9. 12 * 5 = 60.
     60 + 3 = 63. 63 mod 11 = 8. \boxed{12}``), the evaluator re-computes the check with the target subtracted and
     says Correct exactly when the remainder is 0 (``63 - 8 = 55. 55 mod 11 = 0.``), the aggregator and synthesizer
     write each candidate's remainder beside the target (``gives 8, asked 8: same.``), right
     ``SEARCH_JUDGE_ACCURACY`` of the time; the evaluator's calls and the retries are kept twice
     (``SEARCH_DECISION_REPEATS``).
2. Tokenizer. A byte-level BPE trained on the transcripts. Numbers are split off before the BPE so every number is
   its own token, and text is not split at spaces, so the fixed role prompts merge into a few long tokens and
   sequences stay short on CPU.
3. Model. A Qwen3 (hidden 256, 4 layers) trained on chat-templated (messages -> target), loss on the target tokens
   and the closing ``<|im_end|>`` only. Every role prompt is tokenized exactly as the rollout backend does.
4. Check. Format-following per role and base success per workflow and task on ``--check_problems`` held-out
   problems (``trl_multiagent.evaluation.toy`` measures the full figures).

``--roles evaluator --code_problems 0 --hidden_size 128 --num_layers 2 --vocab_size 1024`` builds a small judge
instead: a model with its own, smaller tokenizer that plays the evaluator only (the two-model toy preset).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import math
import os
import random
import re
import time
from dataclasses import dataclass

import torch

from trl_multiagent.evaluation.toy import WORKFLOWS, evaluate, held_out_dataset
from trl_multiagent.tasks.arithmetic import make_arithmetic_problem
from trl_multiagent.tasks.code import code_prompt
from trl_multiagent.tasks.math import extract_boxed, math_prompt
from trl_multiagent.tasks.mod_search import ModSearchProblem, make_mod_search_problem
from trl_multiagent.tasks.registry import get_task
from trl_multiagent.tasks.toy_code import CONSTANTS, make_toy_code_problem
from trl_multiagent.testing import CHAT_TEMPLATE, SPECIAL_TOKENS, qwen_style_tokenizer, random_qwen3
from trl_multiagent.toy import TOY_MODEL_DIR

# Probability that a solver gets a line wrong, by operation. Most errors are one concentrated mistake, so they
# survive sampling at temperature 0.7: the confusable operation (+ <-> -, * -> +, / -> -) or, on a later line,
# restarting from the first count. On "-", "*" and "/" the confusion is more frequent than the right line, so greedy
# decoding misses them too: RL has to overturn a mode there, not only sharpen.
STEP_ERROR = {"+": 0.2, "-": 0.6, "*": 0.65, "/": 0.7}
RESTART_ERROR = 0.25  # a later line restarts from the first count
SLIP_SHARE = 0.1  # share of the errors that are a result off by a little instead
CONFUSED_OPERATION = {"+": "-", "-": "+", "*": "+", "/": "-"}
JUDGE_ACCURACY = 0.8  # evaluator verdicts, aggregator and synthesizer picks
MAX_TOKEN_CHARS = 24  # longest token; the fixed role prompts merge into a few dozen tokens
ORCHESTRATOR_KEEP = 0.25  # the orchestrator's lines come from a fixed pool: a quarter of its calls teach them
SOLVER_KEEP = 0.6  # solver calls outnumber judge calls about 3 to 1; fewer of them leaves the judges more updates
STRATEGIES = (
    "Follow the count one sentence at a time, updating the total after each change.",
    "Write the changes as one expression, then evaluate it from left to right.",
    "Track the count forward, then check the result by undoing each change.",
    "Turn each sentence into one operation on the running total.",
    "List every change in order, then apply them one by one.",
    "Name the operation each sentence asks for before computing anything.",
)

_FIRST = re.compile(r"(\w+) has (\d+) (\w+)\.")
_CHANGES = (
    (re.compile(r"gets (\d+) more"), "+"),
    (re.compile(r"gives away (\d+)"), "-"),
    (re.compile(r"becomes (\d+) times as large"), "*"),
    (re.compile(r"equally among (\d+) people"), "/"),
)


def apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


def operations(problem: str) -> tuple[int, list[tuple[str, int]]]:
    """The start count and the (operation, operand) of each "Then ..." sentence of an arithmetic problem."""
    first = _FIRST.search(problem)
    if first is None:
        raise ValueError(f"Not an arithmetic problem of trl_multiagent.tasks.arithmetic: {problem!r}")
    ops = []
    for sentence in re.findall(r"Then ([^.]*)\.", problem):
        for pattern, op in _CHANGES:
            match = pattern.search(sentence)
            if match:
                ops.append((op, int(match.group(1))))
                break
        else:
            raise ValueError(f"Unknown operation sentence {sentence!r}; update _CHANGES in build_toy_model.py.")
    return int(first.group(2)), ops


@dataclass
class Solution:
    lines: list[str]  # one per operation: "12 + 5 = 17."
    text: str
    answer: int
    wrong_step: int | None  # 1-based index of the first wrong line, None when every line is right
    error: str | None


def solve(problem: str, rng: random.Random) -> Solution:
    """A solver's short worked answer, one line per operation, at most one wrong line (``STEP_ERROR``)."""
    start, ops = operations(problem)
    total = truth = start
    lines, wrong_step, error = [], None, None
    for step, (op, b) in enumerate(ops, start=1):
        truth = apply(truth, op, b)
        first, used_op = total, op
        if wrong_step is None and step > 1 and start != total and rng.random() < RESTART_ERROR:
            first, wrong_step, error = start, step, "restart"
        elif wrong_step is None and rng.random() < STEP_ERROR[op]:
            wrong_step = step
            if rng.random() >= SLIP_SHARE and apply(total, CONFUSED_OPERATION[op], b) >= 0:
                used_op, error = CONFUSED_OPERATION[op], "operation"
            else:
                error = "slip"
        result = apply(first, used_op, b)
        if error == "slip" and wrong_step == step:
            result = max(0, result + rng.choice((-2, -1, 1, 2, 10))) if result > 2 else result + rng.choice((1, 2))
        lines.append(f"{first} {used_op} {b} = {result}.")
        total = result
    if wrong_step is not None and total == truth:  # the error cancelled out: the answer is still right
        wrong_step, error = None, None
    return Solution(lines, f"{' '.join(lines)} \\boxed{{{total}}}", total, wrong_step, error)


_KEYWORD = {"+": "gets", "-": "gives", "*": "times", "/": "shares"}  # each sentence's verb, as the evaluator cites it
_FINDING = {
    None: "Checks out.",
    "operation": "Wrong operation.",
    "slip": "Arithmetic slip.",
    "restart": "Starts from the wrong count.",
}


def step_checks(solution: Solution, ops: list[tuple[str, int]], wrong_step: int | None, error: str | None) -> str:
    """Each line cited with its sentence's verb, up to the judged-wrong one: ``Step 1 (shares): 9 - 3 = 6. Wrong
    operation.``. Citing puts each check right after the line it checks, which a small model can learn; it restates
    the solution, never the right answer."""
    checks = []
    for k, ((op, _), line) in enumerate(zip(ops, solution.lines), start=1):
        checks.append(f"Step {k} ({_KEYWORD[op]}): {line} {_FINDING[error if k == wrong_step else None]}")
        if k == wrong_step:
            break
    return " ".join(checks)


def false_alarm(ops: list[tuple[str, int]], rng: random.Random) -> tuple[int, str]:
    return rng.randint(1, len(ops)), rng.choice(["operation", "slip"])


def review(solution: Solution, problem: str, rng: random.Random) -> str:
    r"""The evaluator's step checks and verdict: ``Step 1 (shares): 9 - 3 = 6. Wrong operation. \boxed{Incorrect}``.

    Right with probability ``JUDGE_ACCURACY``; otherwise it misses the error or raises a false alarm on a random line.
    """
    ops = operations(problem)[1]
    wrong_step, error = solution.wrong_step, solution.error
    if rng.random() >= JUDGE_ACCURACY:
        wrong_step, error = false_alarm(ops, rng) if wrong_step is None else (None, None)
    return f"{step_checks(solution, ops, wrong_step, error)} \\boxed{{{'Incorrect' if wrong_step else 'Correct'}}}"


def judged_pick(right: list[bool], rng: random.Random, accuracy: float) -> int:
    """A judge's pick among candidates (0-based): the first right one with probability ``accuracy`` when there is
    one, else a random one."""
    return right.index(True) if any(right) and rng.random() < accuracy else rng.randrange(len(right))


def compare(candidates: list[Solution], problem: str, rng: random.Random) -> tuple[str, int]:
    """A judge's step checks of the candidates in order, up to the one it picks, and that pick (0-based):
    ``Solution 1: Step 1 (shares): 9 - 3 = 6. Wrong operation. Solution 2: Step 1 (shares): 9 / 3 = 3. Checks out.``

    The checks are the evaluator's, so the aggregator and synthesizer verify the way the evaluator does and start
    above chance. The pick is the first right candidate with probability ``JUDGE_ACCURACY`` when there is one, else
    random; candidates before the pick are called wrong (a false alarm when they are right), the pick checks out.
    """
    ops = operations(problem)[1]
    right = [c.wrong_step is None for c in candidates]
    pick = judged_pick(right, rng, JUDGE_ACCURACY)
    checks = []
    for j, candidate in enumerate(candidates[: pick + 1]):
        if j == pick:
            wrong_step, error = None, None
        elif candidate.wrong_step is not None:
            wrong_step, error = candidate.wrong_step, candidate.error
        else:
            wrong_step, error = false_alarm(ops, rng)
        checks.append(f"Solution {j + 1}: {step_checks(candidate, ops, wrong_step, error)}")
    return " ".join(checks), pick


class Teacher:
    """A scripted ``generate`` for one episode: writes each role's target and records (role, messages, target)."""

    def __init__(self, problem: str, rng: random.Random, records: list):
        self.problem = problem
        self.rng = rng
        self.records = records
        self.solutions: dict[str, Solution] = {}  # every solver output of the episode, by text

    def _candidates(self, content: str) -> list[Solution]:
        blocks = re.split(r"--- Solution \d+ ---\n", content)[1:]
        return [next(s for text, s in self.solutions.items() if text in block) for block in blocks]

    async def __call__(self, role: str, messages: list[dict], *, instance: int = 0) -> str:
        content = messages[-1]["content"]
        if role in ("generator", "worker"):
            solution = solve(self.problem, self.rng)
            self.solutions[solution.text] = solution
            target = solution.text
        elif role == "evaluator":
            reviewed = next(s for text, s in self.solutions.items() if text in content)
            target = review(reviewed, self.problem, self.rng)
        elif role == "aggregator":
            checks, pick = compare(self._candidates(content), self.problem, self.rng)
            target = f"{checks} \\boxed{{{pick + 1}}}"
        elif role == "synthesizer":
            candidates = self._candidates(content)
            checks, pick = compare(candidates, self.problem, self.rng)
            target = f"{checks} \\boxed{{{candidates[pick].answer}}}"
        elif role == "orchestrator":
            chosen = self.rng.sample(STRATEGIES, 3)
            target = "\n".join(f"STRATEGY {k}: {s}" for k, s in enumerate(chosen, start=1))
        else:
            raise ValueError(f"The toy teacher has no script for role {role!r}.")
        self.records.append((role, messages, target))
        return target


# The code world: toy_code problems (trl_multiagent.tasks.toy_code). A solver writes the kind's reference program or
# one of its typical bugs, (finding, program, probability); on sum_two, vowels, count_up and times_k the bug is more
# frequent than the right program, so greedy decoding misses there as on the confusable arithmetic operations.
CODE_BUGS = {
    "sum_two": (
        ("wrong operator", "a, b = map(int, input().split())\nprint(a - b)", 0.55),
        ("missing int conversion", "a, b = input().split()\nprint(a + b)", 0.1),
    ),
    "max_list": (
        ("min instead of max", "n = int(input())\nprint(min(map(int, input().split())))", 0.2),
        ("missing int conversion", "n = int(input())\nprint(max(input().split()))", 0.15),
    ),
    "sum_plus_k": (("forgets to add {k}", "n = int(input())\nprint(sum(map(int, input().split())))", 0.3),),
    "reverse": (("does not reverse", "print(input().strip())", 0.3),),
    "repeat_k": (("off by one", "print(input().strip() * {k_minus_1})", 0.25),),
    "vowels": (("counts consonants", "print(sum(c not in 'aeiou' for c in input().strip()))", 0.6),),
    "parity": (("even and odd swapped", "print('odd' if int(input()) % 2 == 0 else 'even')", 0.3),),
    "count_up": (("off by one", "n = int(input())\nprint(n * (n - 1) // 2)", 0.6),),
    "times_k": (("missing int conversion", "print(input() * {k})", 0.55),),
    "remainder_k": (("quotient instead of remainder", "print(int(input()) // {k})", 0.3),),
}
CODE_STRATEGIES = (
    "Read the input exactly as the statement lays it out, then compute the answer in one expression.",
    "Convert every value to the type it has before using it.",
    "Write the formula the statement gives, then print it.",
    "Read the statement's wording for the exact operation before writing any code.",
    "Check the program on the smallest input by hand.",
    "Use the built-in functions for sums, extremes and counts.",
)


def run_program(program: str, stdin: str) -> str | None:
    """What a trusted teacher program prints on ``stdin`` (in process: the programs are this script's own), or None
    when it raises."""
    lines = iter(stdin.split("\n"))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(program, {"input": lambda: next(lines)})
    except Exception:
        return None
    return out.getvalue()


@dataclass
class Program:
    lines: list[str]
    text: str  # the solver's output: the program in a ```python block
    right: bool  # passes every test of the problem
    wrong_line: int | None  # 1-based index of the first line that differs from the reference, None when none does
    finding: str | None


class CodeProblem:
    """One toy_code problem as the teacher sees it: its kind, constant, reference and tests."""

    def __init__(self, kind: str, rng: random.Random):
        self.kind = kind
        self.k = rng.choice(CONSTANTS)
        statement, self.suite, self.reference = make_toy_code_problem(rng, kind, k=self.k)
        self.prompt = code_prompt(statement, self.suite)
        self.bugs = [
            (finding.format(k=self.k), program.format(k=self.k, k_minus_1=self.k - 1), p)
            for finding, program, p in CODE_BUGS[kind]
        ]

    def program(self, source: str, finding: str | None) -> Program:
        lines = source.split("\n")
        right = all(run_program(source, case.input) == case.output for case in self.suite.cases)
        reference = self.reference.split("\n")
        differs = [i for i, (a, b) in enumerate(zip(lines, reference), start=1) if a != b]
        wrong_line = differs[0] if differs else None
        return Program(lines, f"```python\n{source}\n```", right, wrong_line, finding if wrong_line else None)

    def solve(self, rng: random.Random) -> Program:
        draw = rng.random()
        for finding, source, p in self.bugs:
            if draw < p:
                return self.program(source, finding)
            draw -= p
        return self.program(self.reference, None)

    def false_alarm(self, program: Program, rng: random.Random) -> tuple[int, str]:
        return rng.randint(1, len(program.lines)), rng.choice([finding for finding, _, _ in self.bugs])


def line_checks(program: Program, wrong_line: int | None, finding: str | None) -> str:
    """Each line quoted, up to the judged-wrong one: ``Line 1: print(a - b) - wrong operator.``; the review restates
    the program, never the right one."""
    checks = []
    for k, line in enumerate(program.lines, start=1):
        checks.append(f"Line {k}: {line} - {finding if k == wrong_line else 'checks out'}.")
        if k == wrong_line:
            break
    return " ".join(checks)


def code_judgement(problem: CodeProblem, program: Program, judged_right: bool, rng: random.Random) -> str:
    if judged_right:
        return line_checks(program, None, None)
    if program.wrong_line is not None:
        return line_checks(program, program.wrong_line, program.finding)
    return line_checks(program, *problem.false_alarm(program, rng))  # a false alarm on a right program


def code_review(problem: CodeProblem, program: Program, rng: random.Random) -> str:
    r"""The evaluator's line checks and verdict, right with probability ``JUDGE_ACCURACY``."""
    judged_right = program.right if rng.random() < JUDGE_ACCURACY else not program.right
    verdict = "Correct" if judged_right else "Incorrect"
    return f"{code_judgement(problem, program, judged_right, rng)} \\boxed{{{verdict}}}"


def code_compare(problem: CodeProblem, candidates: list[Program], rng: random.Random) -> tuple[str, int]:
    """The arithmetic judges' ``compare`` for programs: line checks of the candidates in order up to the pick."""
    right = [c.right for c in candidates]
    pick = judged_pick(right, rng, JUDGE_ACCURACY)
    checks = [
        f"Solution {j + 1}: {code_judgement(problem, candidate, j == pick, rng)}"
        for j, candidate in enumerate(candidates[: pick + 1])
    ]
    return " ".join(checks), pick


class CodeTeacher:
    """The ``Teacher`` of one toy_code episode."""

    def __init__(self, problem: CodeProblem, rng: random.Random, records: list):
        self.problem = problem
        self.rng = rng
        self.records = records
        self.programs: dict[str, Program] = {}  # every solver output of the episode, by text

    def _candidates(self, content: str) -> list[Program]:
        blocks = re.split(r"--- Solution \d+ ---\n", content)[1:]
        return [next(p for text, p in self.programs.items() if text in block) for block in blocks]

    async def __call__(self, role: str, messages: list[dict], *, instance: int = 0) -> str:
        content = messages[-1]["content"]
        if role in ("generator", "worker"):
            program = self.problem.solve(self.rng)
            self.programs[program.text] = program
            target = program.text
        elif role == "evaluator":
            reviewed = next(p for text, p in self.programs.items() if text in content)
            target = code_review(self.problem, reviewed, self.rng)
        elif role == "aggregator":
            checks, pick = code_compare(self.problem, self._candidates(content), self.rng)
            target = f"{checks} \\boxed{{{pick + 1}}}"
        elif role == "synthesizer":
            candidates = self._candidates(content)
            checks, pick = code_compare(self.problem, candidates, self.rng)
            target = f"{checks}\n{candidates[pick].text}"
        elif role == "orchestrator":
            chosen = self.rng.sample(CODE_STRATEGIES, 3)
            target = "\n".join(f"STRATEGY {k}: {s}" for k, s in enumerate(chosen, start=1))
        else:
            raise ValueError(f"The toy teacher has no script for role {role!r}.")
        self.records.append((role, messages, target))
        return target


# The search world: mod_search problems (trl_multiagent.tasks.mod_search), k candidates of which one maps to the
# target. A first attempt proposes a candidate uniformly, with its check: one pass knows no better; a retry of Eval-Opt
# reads the tried ones from the previous attempt, writes them and the untried ones, and checks the first untried one.
# Its checks are always right; the judges' errors are slips in a remainder, which flip what they conclude. Each
# decision is written so that it follows from one nearby token, which a small model learns where an equality of two
# numbers was not learned (records V3 and V4 in docs/toy.md): the evaluator subtracts the target before taking the
# remainder and says Correct exactly when that remainder is 0; the retry's candidate is the first of the ``Left``
# list it has just written.
SEARCH_JUDGE_ACCURACY = 0.9  # checking is the easy part of this family, by design
# The calls that carry the workflow's two decisions (the evaluator's verdict, the retry's candidate) are a small share
# of the transcripts and one token each in them; a search build keeps every one of them, this many times.
SEARCH_DECISION_REPEATS = 2
SEARCH_STRATEGIES = (
    "Check the candidates in the order they are listed, one per attempt.",
    "Compute the product first, then add, then take the remainder.",
    "Rule out a candidate by its remainder before trying the next one.",
    "Write each product and sum in full before taking the remainder.",
    "Start with the last candidate listed and work backwards.",
    "Compare the remainder with the target only after finishing the computation.",
)
_TRIED = re.compile(r"Tried ((?:\d+, )*\d+)\.")


def tried_candidates(messages: list[dict]) -> tuple[int, ...]:
    """The candidates earlier attempts of the episode tried, in order, as this call sees them: each assistant turn's
    ``Tried`` list and boxed number (a fresh-history retry sees its latest attempt, whose list carries the others;
    a shared-history one sees every attempt, and critiques box no number)."""
    tried: list[int] = []
    for message in messages:
        if message["role"] != "assistant":
            continue
        listed = _TRIED.search(message["content"])
        boxed = extract_boxed(message["content"])
        numbers = [int(x) for x in listed.group(1).split(", ")] if listed else []
        numbers += [int(boxed)] if boxed is not None and boxed.isdigit() else []
        tried += [x for x in numbers if x not in tried]
    return tuple(tried)


def next_candidate(problem: ModSearchProblem, tried: tuple[int, ...]) -> int:
    """A retry's candidate: the first untried one in the listed order, which the retry has just written as the
    first of its ``Left`` list (the last tried again when every candidate was). A fixed rule, so a small model can
    learn it, where a uniform pick among the untried ones left it copying the previous attempt."""
    left = problem.untried(tried)
    return left[0] if left else tried[-1]


def search_verdict(problem: ModSearchProblem, x: int, judged_right: bool, rng: random.Random) -> tuple[str, str]:
    """What a judge concludes of candidate ``x``, as (the remainder it found, its finding): the true remainder
    unless the judgement is wrong, then a slip that supports it (the target, or another remainder)."""
    right = problem.accepts(x)
    if judged_right == right:
        found = problem.value(x)
    elif judged_right:
        found = problem.target
    else:
        found = rng.choice([r for r in range(problem.modulus) if r != problem.target])
    finding = f"{found}, asked {problem.target}: {'same' if judged_right else 'differs'}"
    return str(found), finding


def search_review(problem: ModSearchProblem, x: int, rng: random.Random, accuracy: float) -> str:
    r"""The evaluator's re-computed check of ``x`` and its verdict, right with probability ``accuracy``: the product
    and the sum, the target subtracted, the remainder of what is left, and ``Correct`` exactly when that remainder
    is 0: ``12 * 5 = 60. 60 + 3 = 63. 63 - 8 = 55. 55 mod 11 = 0. \boxed{Correct}``. A wrong judgement is a slip in
    the last fact (0 for a wrong candidate, another remainder for the right one)."""
    judged_right = problem.accepts(x) if rng.random() < accuracy else not problem.accepts(x)
    *lines, _ = problem.check_lines(x)
    total = x * problem.multiplier + problem.offset
    residual = total - problem.target
    remainder = residual % problem.modulus
    if judged_right != problem.accepts(x):
        remainder = 0 if judged_right else rng.randrange(1, problem.modulus)
    lines += [f"{total} - {problem.target} = {residual}.", f"{residual} mod {problem.modulus} = {remainder}."]
    verdict = "Correct" if judged_right else "Incorrect"
    return f"{' '.join(lines)} \\boxed{{{verdict}}}"


def search_compare(problem: ModSearchProblem, candidates: list[int], rng: random.Random, accuracy: float):
    """A judge's reading of the candidates' stated remainders in order, up to the one it picks, and that pick
    (0-based): ``Solution 1: gives 2, asked 5: differs. Solution 2: gives 5, asked 5: same.``. The pick is the
    first right candidate with probability ``accuracy`` when there is one, else random."""
    right = [problem.accepts(x) for x in candidates]
    pick = judged_pick(right, rng, accuracy)
    checks = [
        f"Solution {j + 1}: gives {search_verdict(problem, x, j == pick, rng)[1]}."
        for j, x in enumerate(candidates[: pick + 1])
    ]
    return " ".join(checks), pick


class SearchTeacher:
    """The ``Teacher`` of one mod_search episode; ``judge_accuracy`` sets how often evaluator verdicts and
    aggregator/synthesizer picks are right."""

    def __init__(
        self,
        problem: ModSearchProblem,
        rng: random.Random,
        records: list,
        judge_accuracy: float = SEARCH_JUDGE_ACCURACY,
    ):
        self.problem = problem
        self.rng = rng
        self.records = records
        self.judge_accuracy = judge_accuracy
        self.attempts: dict[str, int] = {}  # every solver output of the episode, by text -> its candidate

    def _candidates(self, content: str) -> list[int]:
        blocks = re.split(r"--- Solution \d+ ---\n", content)[1:]
        return [next(x for text, x in self.attempts.items() if text in block) for block in blocks]

    async def __call__(self, role: str, messages: list[dict], *, instance: int = 0) -> str:
        content = messages[-1]["content"]
        if role in ("generator", "worker"):
            tried = tried_candidates(messages)
            x = next_candidate(self.problem, tried) if tried else self.rng.choice(self.problem.candidates)
            target = self.problem.worked_answer(x, tried)
            self.attempts[target] = x
        elif role == "evaluator":
            x = next(x for text, x in self.attempts.items() if text in content)
            target = search_review(self.problem, x, self.rng, self.judge_accuracy)
        elif role in ("aggregator", "synthesizer"):
            candidates = self._candidates(content)
            checks, pick = search_compare(self.problem, candidates, self.rng, self.judge_accuracy)
            target = f"{checks} \\boxed{{{pick + 1 if role == 'aggregator' else candidates[pick]}}}"
        elif role == "orchestrator":
            chosen = self.rng.sample(SEARCH_STRATEGIES, 3)
            target = "\n".join(f"STRATEGY {k}: {s}" for k, s in enumerate(chosen, start=1))
        else:
            raise ValueError(f"The toy teacher has no script for role {role!r}.")
        self.records.append((role, messages, target))
        return target


# The toy preset's workflows (guarded prompts, fresh Eval-Opt chats, a fixed worker count, the raw single-agent
# prompt), per task: the requests the shipped toy model was trained on, and the ones recipes/configs/toy*.yaml run.
TAUGHT = {task: tuple(build(task) for build in WORKFLOWS.values()) for task in ("math", "code")}


def transcripts(
    n_problems: int, seed: int, n_code_problems: int = 0, n_search_problems: int = 0
) -> list[tuple[str, list[dict], str]]:
    """(role, messages, target) for every call of every built-in workflow on ``n_problems`` fresh arithmetic problems,
    ``n_code_problems`` toy_code problems and ``n_search_problems`` fresh mod_search problems."""
    rng = random.Random(seed)
    held_out = {row["prompt"][0]["content"] for row in held_out_dataset(1000)}  # never trained on
    records: list = []
    count = 0
    while count < n_problems:
        problem, _ = make_arithmetic_problem(rng)
        if math_prompt(problem)[0]["content"] in held_out:
            continue
        count += 1
        for workflow in TAUGHT["math"]:
            asyncio.run(workflow.run(math_prompt(problem), Teacher(problem, rng, records)))
    # toy_code has 38 statements, so held-out code problems share theirs with training ones; their tests are new.
    kinds = sorted(CODE_BUGS)
    for _ in range(n_code_problems):
        problem = CodeProblem(rng.choice(kinds), rng)
        for workflow in TAUGHT["code"]:
            asyncio.run(workflow.run(problem.prompt, CodeTeacher(problem, rng, records)))
    # Drawn after the others, so a build without them (the shipped toy model's) makes the same transcripts as before.
    first_search = len(records)
    if n_search_problems:
        search_held_out = {row["prompt"][0]["content"] for row in get_task("math").eval_dataset("mod_search", 1000)}
        count = 0
        while count < n_search_problems:
            search = make_mod_search_problem(rng)
            if math_prompt(search.text)[0]["content"] in search_held_out:
                continue
            count += 1
            for workflow in TAUGHT["math"]:
                asyncio.run(workflow.run(math_prompt(search.text), SearchTeacher(search, rng, records)))
    keep = {"orchestrator": ORCHESTRATOR_KEEP, "generator": SOLVER_KEEP, "worker": SOLVER_KEEP}
    kept = []
    for i, record in enumerate(records):
        role, _, target = record
        decision = i >= first_search and (role == "evaluator" or target.startswith("Tried "))
        if rng.random() < (1.0 if decision else keep.get(role, 1.0)):
            kept += [record] * (SEARCH_DECISION_REPEATS if decision else 1)
    return kept


def build_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE over the transcripts: numbers are whole tokens, and merges may cross spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=MAX_TOKEN_CHARS,
    )
    numbers = [" ".join(str(n) for n in range(300))] * 200  # every count a problem can reach is one token
    bpe.train_from_iterator(texts + numbers, trainer=trainer)
    return qwen_style_tokenizer(bpe)


def build_model(tokenizer, hidden_size: int, num_layers: int, seed: int):
    return random_qwen3(
        tokenizer,
        seed,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=hidden_size // 64,
        head_dim=32,  # vLLM's CPU attention rejects 16
        max_position_embeddings=1024,
    )


def encode(tokenizer, records) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per call: the prompt exactly as the rollout backend tokenizes it, then the target."""
    examples = []
    for _, messages, target in records:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        completion = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((prompt + completion, len(prompt)))
    return examples


def batches(examples, tokens_per_batch: int, rng: random.Random):
    """Length-bucketed batches of about ``tokens_per_batch`` padded tokens, in random order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    result, current = [], []
    for i in order:
        if current and (len(current) + 1) * len(examples[i][0]) > tokens_per_batch:
            result.append(current)
            current = []
        current.append(i)
    result.append(current)
    rng.shuffle(result)
    return result


def collate(examples, indices: list[int], pad_id: int):
    width = max(len(examples[i][0]) for i in indices)
    input_ids = torch.full((len(indices), width), pad_id)  # [B, L], right-padded
    labels = torch.full((len(indices), width), -100)  # [B, L], -100 outside the target tokens
    attention_mask = torch.zeros((len(indices), width), dtype=torch.long)
    for row, i in enumerate(indices):
        ids, prompt_length = examples[i]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask, labels


def train(model, examples, pad_id: int, steps: int, tokens_per_batch: int, lr: float, seed: int, log) -> None:
    """AdamW with warm-up and cosine decay to 10% of ``lr``, on length-bucketed batches, for ``steps`` steps."""
    rng = random.Random(seed)
    plan = []
    while len(plan) < steps:
        plan += batches(examples, tokens_per_batch, rng)
    plan = plan[:steps]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, min(200, steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))),
    )
    model.train()
    start, running = time.process_time(), []
    for step, indices in enumerate(plan, start=1):
        input_ids, attention_mask, labels = collate(examples, indices, pad_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        running.append(loss.item())
        if step % 100 == 0 or step == len(plan):
            cpu = time.process_time() - start
            log(f"step {step}/{len(plan)} loss {sum(running) / len(running):.4f} cpu {cpu / 60:.1f} min")
            running = []
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default=TOY_MODEL_DIR)
    parser.add_argument("--problems", type=int, default=10000, help="arithmetic problems; every workflow runs on each")
    parser.add_argument(
        "--code_problems", type=int, default=6000, help="toy_code problems; every workflow runs on each"
    )
    parser.add_argument(
        "--search_problems",
        type=int,
        default=0,
        help="mod_search problems (easy to check, hard to answer in one pass); every math workflow runs on each. "
        "The shipped toy model is built without them (0)",
    )
    parser.add_argument("--steps", type=int, default=2600)
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--check_problems", type=int, default=100, help="held-out problems for the final check")
    parser.add_argument(
        "--roles",
        nargs="+",
        default=None,
        help="train on these roles' calls only (e.g. `evaluator` for a small judge model); default: every role",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    # 1. Transcripts of every built-in workflow, from the scripted teacher.
    records = transcripts(args.problems, args.seed, args.code_problems, args.search_problems)
    if args.roles:
        records = [record for record in records if record[0] in args.roles]
    log(
        f"{len(records)} calls from {args.problems} arithmetic, {args.code_problems} toy_code and "
        f"{args.search_problems} mod_search problems"
    )

    # 2. Tokenizer on the chat-templated transcripts.
    from jinja2 import Template

    template = Template(CHAT_TEMPLATE)
    sample = random.Random(args.seed).sample(records, min(len(records), 20000))
    texts = [template.render(messages=[*m, {"role": "assistant", "content": t}]) for _, m, t in sample]
    tokenizer = build_tokenizer(texts, args.vocab_size)

    # 3. The model, trained on (prompt -> target) with loss on the target tokens.
    model = build_model(tokenizer, args.hidden_size, args.num_layers, args.seed)
    log(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    examples = encode(tokenizer, records)
    longest = {}
    for (role, _, _), (ids, prompt_length) in zip(records, examples):
        longest[role] = max(longest.get(role, 0), len(ids) - prompt_length)
    log(f"longest target in tokens (with <|im_end|>): {longest}")
    cpu = time.process_time()
    train(model, examples, tokenizer.pad_token_id, args.steps, args.tokens_per_batch, args.lr, args.seed, log)
    log(f"trained in {(time.process_time() - cpu) / 60:.1f} CPU minutes")
    os.makedirs(args.output_dir, exist_ok=True)
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    log(f"saved to {args.output_dir}")

    # 4. Check on held-out problems: format-following per role, base success per workflow.
    tasks = [task for task, n in (("math", args.problems), ("code", args.code_problems)) if n and args.check_problems]
    for task in tasks if not args.roles else ():  # a judge-only model is checked beside a solver (toy_two_models)
        for name in WORKFLOWS:
            result = evaluate(args.output_dir, name, n=args.check_problems, samples=1, task=task)
            formats = ", ".join(f"{role} {rate:.0%}" for role, rate in result["format_sampled"].items())
            log(
                f"{task} {name}: greedy {result['greedy']:.0%}, sampled {result['pass@1']:.0%}; "
                f"format (sampled): {formats}"
            )


if __name__ == "__main__":
    main()
