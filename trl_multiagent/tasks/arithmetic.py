r"""Offline arithmetic word problems with exact integer answers, for CPU runs and tests.

Same columns as the math task (``prompt``, ``answer``), so ``math_reward`` grades them. Problems are one or two
operations on small non-negative integers, sized for a ~10M-parameter toy model.
"""

from __future__ import annotations

import random

from datasets import Dataset

from .math import math_prompt

_NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana")
_ITEMS = ("apples", "pens", "coins", "books", "shells", "stamps", "marbles", "cards")


def _step(rng: random.Random, total: int, max_operand: int, name: str, item: str) -> tuple[str, int]:
    """One more sentence acting on ``total``; every result stays a non-negative integer."""
    op = rng.choice("+-*/")
    if op == "+":
        b = rng.randint(1, max_operand)
        return f"Then {name} gets {b} more {item}.", total + b
    if op == "-" and total > 0:
        b = rng.randint(1, min(total, max_operand))
        return f"Then {name} gives away {b} {item}.", total - b
    if op == "*" and total <= max_operand:
        b = rng.randint(2, 4)
        return f"Then the number of {item} becomes {b} times as large.", total * b
    divisors = [d for d in (2, 3, 4, 5) if total > 0 and total % d == 0]
    if divisors:
        d = rng.choice(divisors)
        return (
            f"Then {name} shares the {item} equally among {d} people, {name} included, and keeps one share.",
            total // d,
        )
    b = rng.randint(1, max_operand)
    return f"Then {name} gets {b} more {item}.", total + b


def make_arithmetic_problem(rng: random.Random, max_operand: int = 20, max_operations: int = 2) -> tuple[str, int]:
    """(problem text, answer) with 1..``max_operations`` operations on integers up to ``max_operand``."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    total = rng.randint(1, max_operand)
    sentences = [f"{name} has {total} {item}."]
    for _ in range(rng.randint(1, max_operations)):
        sentence, total = _step(rng, total, max_operand, name, item)
        sentences.append(sentence)
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), total


def make_arithmetic_dataset(n: int, seed: int = 0, max_operand: int = 20, max_operations: int = 2) -> Dataset:
    r"""``n`` word problems as TRL rows: ``prompt`` (asks for the answer in \boxed{}) and ``answer`` (str)."""
    if n < 0 or max_operand < 1 or max_operations < 1:
        raise ValueError(
            f"Need n >= 0, max_operand >= 1, max_operations >= 1; got {n}, {max_operand}, {max_operations}."
        )
    rng = random.Random(seed)
    rows = [make_arithmetic_problem(rng, max_operand, max_operations) for _ in range(n)]
    return Dataset.from_dict({"prompt": [math_prompt(text) for text, _ in rows], "answer": [str(a) for _, a in rows]})
