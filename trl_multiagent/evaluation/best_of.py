"""Best-of-n selection: one answer out of ``n`` independent samples of a single agent, the cost-matched baseline.

A workflow that makes ``c`` model calls per episode is compared with SA-RL sampled ``n = ceil(c)`` times per problem
and one of its answers chosen, so that a workflow's gain over SA-RL cannot be just more samples. ``majority_vote``
chooses among the samples' final answers, each read with the answering role's declared format
(``workflows.formats``: the last ``\\boxed{}`` for math, the last code block for code, the rules the task rewards
read), so the chosen sample is graded exactly as an episode's answer is. ``judged_choice`` chooses by a trained judge's
verdicts: the majority among the samples the judge accepts (the judged best-of-n, ``judged.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

SELECTIONS = ("majority", "judge")


def answer_key(answer: str | None) -> str | None:
    """What two samples must share to vote for the same answer: the parsed answer with runs of whitespace made one
    space (``"1 / 2"`` and ``"1  /  2"`` agree; ``"1/2"`` and ``"0.5"`` do not: answers are compared as written)."""
    return None if answer is None else " ".join(answer.split())


def majority_vote(answers: Sequence[str | None]) -> int:
    """The index of the sample whose answer is chosen: the most frequent parsed answer (``answer_key``), a tie going
    to the answer that appears first, represented by its first sample. Unparseable answers (``None``) do not vote;
    when no sample has a parseable answer, the first sample is chosen (it is graded as it stands, like any episode
    whose answer cannot be read)."""
    if not answers:
        raise ValueError("majority_vote needs at least one sample's answer.")
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, answer in enumerate(answers):
        key = answer_key(answer)
        if key is None:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, index)
    if not counts:
        return 0
    winner = max(counts, key=lambda key: (counts[key], -first[key]))
    return first[winner]


def judged_choice(answers: Sequence[str | None], accepted: Sequence[bool]) -> int:
    """The index of the sample chosen by a judge's verdicts: the majority answer (``majority_vote``) among the
    samples judged correct; when the judge accepts none, the majority among all of them."""
    if len(accepted) != len(answers):
        raise ValueError(
            f"judged_choice needs one verdict per sample: {len(answers)} answers, {len(accepted)} verdicts."
        )
    kept = [index for index, ok in enumerate(accepted) if ok]
    if not kept:
        return majority_vote(answers)
    return kept[majority_vote([answers[index] for index in kept])]


def select(answers: Sequence[str | None], selection: str) -> int:
    """The chosen sample's index under ``selection`` "majority" (a judge's choice needs its verdicts:
    ``judged_choice``)."""
    if selection == "majority":
        return majority_vote(answers)
    if selection == "judge":
        raise ValueError("The 'judge' selection reads a judge's verdicts: use judged_choice(answers, accepted).")
    raise ValueError(f"Unknown best-of selection {selection!r}; the selections are {', '.join(SELECTIONS)}.")


def matched_best_of(rows: list[dict[str, Any]], like: dict[str, Any], source: str) -> tuple[int, dict[str, Any]]:
    """``n`` for a best-of evaluation cost-matched to a workflow: its newest evaluation in ``rows`` sampled like
    ``like`` (task, dataset, problems, k, temperature, top_p, tokens per call, seed), its measured model calls per
    episode (``mean_calls``) rounded up; and that row. ``source`` names where ``rows`` came from, for the error."""
    fields = ("task", "dataset", "num_problems", "k", "temperature", "top_p", "max_completion_length", "seed")
    found = [
        row
        for row in rows
        if row.get("mode") == "trained"
        and not row.get("role_policies")
        and not row.get("best_of")
        and all(row.get(name) == like[name] for name in fields)
    ]
    if not found:
        wanted = ", ".join(f"{name}={like[name]}" for name in fields)
        raise ValueError(
            f"{source} has no evaluation of its own trained workflow with {wanted}: evaluate it first with the same "
            "flags (its measured calls per episode set n), or give --best_of n."
        )
    row = max(found, key=lambda row: row["step"])
    if "mean_calls" not in row:
        raise ValueError(f"{source}'s evaluation at step {row['step']} does not record mean_calls; evaluate it again.")
    return max(1, math.ceil(row["mean_calls"] - 1e-9)), row
