r"""Offline search problems that are easy to check and hard to answer in one pass: the verification-easy toy family.

A problem lists ``k`` candidates and a forward computation; exactly one candidate gives the target::

    Which of the numbers 4, 12, 9, 7 is x, if x * 5 + 3 leaves remainder 8 when divided by 11?

Checking a candidate is three lines the toy model can write and re-read, each one fact of the kind the arithmetic
family teaches (a product, a sum, a remainder): ``12 * 5 = 60. 60 + 3 = 63. 63 mod 11 = 8.`` Same columns as
the math task (``prompt``, ``answer``), so ``math_reward`` grades the boxed candidate; ``ModSearchProblem`` parses a
problem back from its text and ``accepts`` exactly the right candidate.

Why one pass stays near 1/k. The right candidate is the only one whose value is the target, and nothing else marks
it: its position is balanced over the ``k`` slots (``make_mod_search_dataset`` draws a fresh permutation of the
slots per block of ``k`` rows), the candidates are drawn alike, and the map x -> (a x + b) mod m, with a multiplier
that is neither 0 nor 1 modulo a prime m, leaves no surface cue (closest value, parity, last digit: each picks the
right one about 1/k of the time; the tests measure it). What a single pass sees is the problem and the tokens it has
written so far, so it can beat 1/k only by computing values:

- in writing: the per-call budget ``ONE_CHECK_TOKENS`` (``max_completion_length`` for this family on the toy model)
  holds one check in the taught format, with the list of tried candidates and the box, but not two. A pass that
  checks one candidate and, when it misses, boxes another succeeds 1/k + (1 - 1/k) / (k - 1) = 2/k; that is the
  written ceiling of one pass (with k = 4: 25% without a check, 50% with one);
- in its hidden state: the values of k candidates, each three chained lookups over parameters that change per
  problem (about 1,500 (x, a, b, m) combinations), compared with the target, before the first answer token. The
  toy model (4 layers) is never shown this, its teacher's first guesses are uniform, and RL at toy budgets gives
  about one bit per episode (a few thousand episodes per run): far too little to learn a two- or three-hop
  composition that small transformers are known to miss without writing the intermediate steps.

The ceiling is thus a property of the task and the budget, not of how long SA-RL trains; its honest limit is the
format: a policy that invented a terse check (only the values, ``12 60 63 8``) could fit several in the budget.
Nothing in the teacher's transcripts writes one, so RL would have to discover it from samples at temperature 0.7;
the number of checks a trained single agent writes per answer is the thing to watch.

Why several calls are worth more. Eval-Opt with the toy preset's loop (``max_iterations=3``): the generator proposes
a candidate with its check, the evaluator re-computes the check with the target subtracted before the remainder
(``63 - 8 = 55. 55 mod 11 = 0.``) and says ``\boxed{Correct}`` exactly when that remainder is 0, else
``\boxed{Incorrect}``, and each retry reads the previous attempt, which lists the candidates already tried, and
proposes an untried one. With an evaluator right with probability q, the episode finds the answer with probability
that reaches min(1, 3/k) at q = 1 (k = 4: 75% against one pass's 25%, or 50% for a pass that checks and switches);
at the teacher's q = 0.9 the scripted policies give about 63% (``scripts/mod_search_feasibility.py`` simulates these
policies on held-out problems without a model).

What a cost-matched single agent can do (the same number of calls): majority vote over n one-pass answers gains
nothing here, because the answers are uniform guesses with no signal to agree on. Best-of-n judged by the same
evaluator does search: with n = 3 attempts drawn independently it finds the answer with probability about
1 - (1 - 1/k)^3 (58% at k = 4, q = 1), below Eval-Opt's 75% only because independent attempts repeat candidates and
Eval-Opt's retries, seeing the history, do not. So on this family the gain of a trained workflow over SA-RL comes
from verification plus search, which a judged best-of-n also buys; what is specific to Eval-Opt's shared history is
the difference between the two (about 17 points at k = 4), and that is the figure to report beside the headline gap.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from datasets import Dataset

from .math import math_prompt

N_CANDIDATES = 4  # k: one pass ~1/k, three Eval-Opt attempts with an accurate evaluator ~3/k
# Small numbers, so the toy model's checks come out right: with these candidates, multipliers and offsets every number
# a check writes stays below 100 (a product, a sum, a remainder): a few hundred facts, each seen often in training.
CANDIDATES = range(2, 16)  # candidate values
MULTIPLIERS = range(2, 6)
OFFSETS = range(1, 10)
MODULI = (7, 11, 13)  # primes: a multiplier that is not 0 modulo m maps distinct residues to distinct values
# max_completion_length for this family on the toy model: one generator answer (tried list, one check, the box) fits
# in the toy tokenizer, two checks and a box do not (tests/tasks/test_tasks_mod_search.py measures both).
ONE_CHECK_TOKENS = 40

_TEXT = re.compile(
    r"Which of the numbers (\d+(?:, \d+)+) is x, if x \* (\d+) \+ (\d+) leaves remainder (\d+) when divided by "
    r"(\d+)\?"
)


@dataclass(frozen=True)
class ModSearchProblem:
    """Candidates and the map x -> (multiplier * x + offset) mod modulus; exactly one candidate maps to target."""

    candidates: tuple[int, ...]
    multiplier: int
    offset: int
    modulus: int
    target: int

    def __post_init__(self) -> None:
        hits = [x for x in self.candidates if self.value(x) == self.target]
        if len(hits) != 1:
            raise ValueError(
                f"A mod_search problem needs exactly one candidate with value {self.target}; "
                f"{self.candidates} has {len(hits)} ({hits}). Draw problems with make_mod_search_problem."
            )

    @property
    def text(self) -> str:
        listed = ", ".join(map(str, self.candidates))
        return (
            f"Which of the numbers {listed} is x, if x * {self.multiplier} + {self.offset} leaves remainder "
            f"{self.target} when divided by {self.modulus}?"
        )

    @property
    def answer(self) -> int:
        return next(x for x in self.candidates if self.value(x) == self.target)

    def value(self, x: int) -> int:
        return (x * self.multiplier + self.offset) % self.modulus

    def check_lines(self, x: int) -> list[str]:
        """The forward computation of ``x``, one fact per line: ``12 * 5 = 60.``, ``60 + 3 = 63.``,
        ``63 mod 11 = 8.``"""
        product = x * self.multiplier
        total = product + self.offset
        return [
            f"{x} * {self.multiplier} = {product}.",
            f"{product} + {self.offset} = {total}.",
            f"{total} mod {self.modulus} = {total % self.modulus}.",
        ]

    def untried(self, tried: tuple[int, ...]) -> tuple[int, ...]:
        """The candidates not in ``tried``, in the listed order."""
        return tuple(x for x in self.candidates if x not in tried)

    def worked_answer(self, x: int, tried: tuple[int, ...] = ()) -> str:
        r"""One pass's answer as the toy teacher writes it: on a retry the candidates already tried and those left
        (in the listed order), then the check of ``x``, ``x`` boxed:
        ``Tried 7, 4. Left 12, 9. 12 * 5 = 60. 60 + 3 = 63. 63 mod 11 = 8. \boxed{12}``."""
        listed = ""
        if tried:
            listed = f"Tried {', '.join(map(str, tried))}. "
            left = self.untried(tried)
            listed += f"Left {', '.join(map(str, left))}. " if left else ""
        return f"{listed}{' '.join(self.check_lines(x))} \\boxed{{{x}}}"

    def accepts(self, x: int) -> bool:
        """Whether ``x`` is the answer: one of the listed candidates, with the target value."""
        return x in self.candidates and self.value(x) == self.target

    @classmethod
    def parse(cls, text: str) -> ModSearchProblem:
        """The problem in ``text`` (a problem statement or a prompt holding one)."""
        match = _TEXT.search(text)
        if match is None:
            raise ValueError(f"No mod_search problem in {text!r}; its rows come from make_mod_search_dataset.")
        listed, multiplier, offset, target, modulus = match.groups()
        return cls(tuple(int(x) for x in listed.split(", ")), int(multiplier), int(offset), int(modulus), int(target))


def make_mod_search_problem(
    rng: random.Random, right: int | None = None, n_candidates: int = N_CANDIDATES
) -> ModSearchProblem:
    """A problem whose answer sits at index ``right`` (default: drawn) among ``n_candidates`` candidates.

    The candidates are drawn first and redrawn until their values differ, and only then is the right one chosen by
    position, so the answer's value is distributed like any other candidate's.
    """
    if n_candidates < 2 or n_candidates > min(MODULI):
        raise ValueError(f"n_candidates must be 2..{min(MODULI)} (distinct remainders), got {n_candidates}.")
    if right is None:
        right = rng.randrange(n_candidates)
    if not 0 <= right < n_candidates:
        raise ValueError(f"right must be a candidate index, 0..{n_candidates - 1}; got {right}.")
    modulus = rng.choice(MODULI)
    multiplier = rng.choice([a for a in MULTIPLIERS if a % modulus not in (0, 1)])
    offset = rng.choice(OFFSETS)
    while True:
        candidates = tuple(rng.sample(CANDIDATES, n_candidates))
        values = [(x * multiplier + offset) % modulus for x in candidates]
        if len(set(values)) == n_candidates:
            return ModSearchProblem(candidates, multiplier, offset, modulus, values[right])


def make_mod_search_dataset(n: int, seed: int = 0, n_candidates: int = N_CANDIDATES) -> Dataset:
    r"""``n`` problems as TRL rows: ``prompt`` (asks for the answer in \boxed{}) and ``answer`` (str).

    Balanced over the slots: each block of ``n_candidates`` rows puts the answer once in every slot, in a random
    order, so any first ``m`` rows (the held-out ``limit``) are balanced to within one row per slot.
    """
    if n < 0:
        raise ValueError(f"Need n >= 0, got {n}.")
    rng = random.Random(seed)
    problems = []
    while len(problems) < n:
        for right in rng.sample(range(n_candidates), n_candidates):
            problems.append(make_mod_search_problem(rng, right, n_candidates))
    problems = problems[:n]
    return Dataset.from_dict(
        {"prompt": [math_prompt(p.text) for p in problems], "answer": [str(p.answer) for p in problems]}
    )
