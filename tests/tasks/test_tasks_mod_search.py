"""The mod_search family: seeded, balanced over the candidate slots, one right candidate, no surface cue to it, and a
check that fits the toy model's per-call budget once but not twice."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from trl_multiagent.tasks import get_task
from trl_multiagent.tasks.math import extract_boxed
from trl_multiagent.tasks.mod_search import (
    N_CANDIDATES,
    ONE_CHECK_TOKENS,
    ModSearchProblem,
    make_mod_search_dataset,
    make_mod_search_problem,
)
from trl_multiagent.tasks.registry import GENERATED_TRAIN_SIZE
from trl_multiagent.workflows.correctness import solved


def problems(n: int, seed: int = 0) -> list[ModSearchProblem]:
    return [ModSearchProblem.parse(row["prompt"][0]["content"]) for row in make_mod_search_dataset(n, seed)]


def test_rows_are_seeded_and_the_answer_column_is_the_right_candidate():
    rows = make_mod_search_dataset(40, seed=3)
    assert rows.to_list() == make_mod_search_dataset(40, seed=3).to_list()
    assert rows.to_list() != make_mod_search_dataset(40, seed=4).to_list()
    for row in rows:
        problem = ModSearchProblem.parse(row["prompt"][0]["content"])
        assert row["answer"] == str(problem.answer)
        assert [problem.value(x) == problem.target for x in problem.candidates].count(True) == 1


def test_every_prefix_is_balanced_over_the_candidate_slots():
    slots = [p.candidates.index(p.answer) for p in problems(1003, seed=5)]
    for n in (20, 101, 1003):  # a held-out `limit` takes the first n rows
        counts = Counter(slots[:n])
        assert set(counts) == set(range(N_CANDIDATES))
        assert max(counts.values()) - min(counts.values()) <= 1, (n, counts)
    assert slots[:20] == [p.candidates.index(p.answer) for p in problems(20, seed=5)]  # a prefix is the same rows


def test_the_checker_accepts_exactly_the_right_candidate():
    rng = random.Random(0)
    for _ in range(300):
        problem = make_mod_search_problem(rng)
        assert [x for x in problem.candidates if problem.accepts(x)] == [problem.answer]
        twin = problem.answer + problem.modulus  # same value, not listed
        assert problem.value(twin) == problem.target and not problem.accepts(twin)
    with pytest.raises(ValueError, match="exactly one candidate"):
        ModSearchProblem((3, 10), multiplier=2, offset=1, modulus=7, target=0)  # 3 and 10 share a remainder


def test_check_lines_compute_the_value_one_fact_at_a_time():
    problem = ModSearchProblem((14, 27, 9, 22), multiplier=7, offset=3, modulus=11, target=5)
    assert problem.check_lines(27) == ["27 * 7 = 189.", "189 + 3 = 192.", "192 mod 11 = 5."]
    assert problem.worked_answer(27, tried=(14, 9)) == (
        "Tried 14, 9. Left 27, 22. 27 * 7 = 189. 189 + 3 = 192. 192 mod 11 = 5. \\boxed{27}"
    )
    assert problem.untried((14, 9)) == (27, 22) and problem.untried(problem.candidates) == ()
    assert extract_boxed(problem.worked_answer(27)) == "27"
    assert problem.answer == 27 and problem.value(14) == 2
    assert ModSearchProblem.parse(f"Intro.\n{problem.text}\n\nPut the final answer in a box.") == problem
    with pytest.raises(ValueError, match="make_mod_search_dataset"):
        ModSearchProblem.parse("Ann has 3 apples.")


def test_no_surface_cue_points_at_the_answer():
    """Guessers that read the problem without computing values find the answer about 1/k of the time."""
    sample = problems(4000, seed=11)
    guessers = {
        "first": lambda p: p.candidates[0],
        "largest": lambda p: max(p.candidates),
        "closest to the target": lambda p: min(p.candidates, key=lambda x: abs(x - p.target)),
        "same parity as the target": lambda p: next(
            (x for x in p.candidates if x % 2 == p.target % 2), p.candidates[0]
        ),
        "same last digit as the target": lambda p: next(
            (x for x in p.candidates if x % 10 == p.target % 10), p.candidates[0]
        ),
        "same remainder as the target": lambda p: next(
            (x for x in p.candidates if x % p.modulus == p.target), p.candidates[0]
        ),
    }
    chance = 1 / N_CANDIDATES
    for name, guess in guessers.items():
        rate = sum(p.accepts(guess(p)) for p in sample) / len(sample)
        assert abs(rate - chance) < 0.03, (name, rate)  # 4.4 standard errors of a 4,000-problem rate at 1/4


def test_registered_as_a_math_generator_graded_by_the_math_reward():
    spec = get_task("math")
    train = spec.train_dataset("mod_search", seed=0)
    held_out = spec.eval_dataset("mod_search", limit=8)
    assert len(train) == GENERATED_TRAIN_SIZE and len(held_out) == 8
    assert held_out.to_list() != make_mod_search_dataset(8, seed=0).to_list()
    assert held_out.to_list() == spec.eval_dataset("mod_search").to_list()[:8]  # the first rows of the full split
    rows = held_out.to_list()
    for row in rows:
        problem = ModSearchProblem.parse(row["prompt"][0]["content"])
        texts = [problem.worked_answer(x) for x in problem.candidates]
        rewards = spec.make_reward()(
            [[{"role": "assistant", "content": t}] for t in texts], answer=[row["answer"]] * 4
        )
        assert [solved(r) for r in rewards] == [problem.accepts(x) for x in problem.candidates]


def test_one_check_fits_the_budget_in_the_toy_tokenizer_and_two_do_not():
    """The one-pass ceiling rests on this: an answer with one check (and the longest tried list) fits
    ONE_CHECK_TOKENS, one with two checks does not, whichever numbers it holds."""
    from transformers import AutoTokenizer

    from trl_multiagent.toy import TOY_MODEL_DIR

    tokenizer = AutoTokenizer.from_pretrained(TOY_MODEL_DIR)

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1  # and <|im_end|>

    one, two = [], []
    for problem in problems(200, seed=2):
        x, *others = problem.candidates
        one.append(length(problem.worked_answer(x, tried=tuple(others))))
        two.append(length(f"{' '.join(problem.check_lines(others[0]))} {problem.worked_answer(x)}"))
    assert max(one) <= ONE_CHECK_TOKENS < min(two), (max(one), min(two))


def test_the_budget_is_the_one_mod_search_is_trained_and_evaluated_with():
    """Without it a pass could write two checks and the one-pass ceiling would be gone: the toy evaluation runs
    mod_search at ONE_CHECK_TOKENS per call (the grid's family trains and evaluates at it too), arithmetic as
    before."""
    from trl_multiagent.evaluation.toy import MAX_NEW_TOKENS, toy_settings

    assert toy_settings("math", 10, 0.0, dataset="mod_search").max_completion_length == ONE_CHECK_TOKENS
    assert toy_settings("math", 10, 0.0).max_completion_length == MAX_NEW_TOKENS > ONE_CHECK_TOKENS
