"""The toy teacher's mod_search roles (scripts/build_toy_model.py, ``--search_problems``): what a rebuilt toy model
would learn on the verification-easy family. A first attempt guesses a uniform candidate with a right check, a retry
writes the untried candidates and checks the first of them, the judges write the target beside each remainder and are
right at their set accuracy, and a search build keeps the calls that carry these decisions more than once."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from trl_multiagent.evaluation.toy import WORKFLOWS, follows_format
from trl_multiagent.tasks.math import extract_boxed, math_prompt
from trl_multiagent.tasks.mod_search import N_CANDIDATES, ModSearchProblem, make_mod_search_problem
from trl_multiagent.workflows import EvalOpt

PROBLEM = ModSearchProblem((14, 27, 9, 22), multiplier=7, offset=3, modulus=11, target=5)  # answer 27


def episode(build, workflow, problem: ModSearchProblem, seed: int, **teacher) -> tuple[str, list]:
    records: list = []
    final = asyncio.run(
        workflow.run(math_prompt(problem.text), build.SearchTeacher(problem, random.Random(seed), records, **teacher))
    )
    return final, records


def test_search_transcripts_cover_every_math_role_and_follow_its_format(build):
    records = build.transcripts(0, seed=1, n_search_problems=30)
    assert {role for role, _, _ in records} == {
        "generator",
        "evaluator",
        "aggregator",
        "orchestrator",
        "worker",
        "synthesizer",
    }
    assert all("leaves remainder" in messages[0]["content"] for _, messages, _ in records)
    workflow_of = {role: workflow for workflow in (b() for b in WORKFLOWS.values()) for role in workflow.roles}
    assert [(role, t) for role, _, t in records if not follows_format(workflow_of[role], role, t)] == []


def test_a_first_guess_is_a_uniform_candidate_with_its_right_check(build):
    workflow = WORKFLOWS["single_agent"]()
    guesses = Counter()
    for seed in range(800):
        final, records = episode(build, workflow, PROBLEM, seed)
        ((role, _, text),) = records
        x = int(extract_boxed(text))
        assert role == "generator" and final == text == PROBLEM.worked_answer(x)
        guesses[x] += 1
    assert set(guesses) == set(PROBLEM.candidates)
    assert all(abs(n / 800 - 1 / N_CANDIDATES) < 0.06 for n in guesses.values()), guesses


@pytest.mark.parametrize("history", ["fresh", "shared"])
def test_retries_read_the_tried_candidates_from_the_history_and_never_repeat(build, history):
    """With a judge that is always right, Eval-Opt tries distinct candidates until it meets the answer: within
    three attempts on four candidates it misses only when the answer is the fourth one tried."""
    workflow = EvalOpt(max_iterations=3, history=history, prompts="guarded", parsing="robust")
    rng = random.Random(0)
    solved = 0
    for seed in range(300):
        problem = make_mod_search_problem(rng)
        final, records = episode(build, workflow, problem, seed, judge_accuracy=1.0)
        tried = [int(extract_boxed(t)) for role, _, t in records if role == "generator"]
        assert len(set(tried)) == len(tried), tried
        assert (problem.answer in tried) == problem.accepts(int(extract_boxed(final)))
        assert tried[-1] == problem.answer or len(tried) == 3
        solved += problem.accepts(int(extract_boxed(final)))
    assert 0.65 < solved / 300 < 0.85  # 3/4 expected


@pytest.mark.parametrize("history", ["fresh", "shared"])
def test_a_retry_writes_the_untried_candidates_and_checks_the_first(build, history):
    """The retry's candidate is fixed by the history (not a fresh guess), so a model can learn it: it writes the
    candidates tried and those left in the listed order, and checks the first one left."""
    workflow = EvalOpt(max_iterations=3, history=history, prompts="guarded", parsing="robust")
    lengths = set()
    for seed in range(200):
        _, records = episode(build, workflow, PROBLEM, seed, judge_accuracy=1.0)  # retries until the answer
        texts = [t for role, _, t in records if role == "generator"]
        tried = [int(extract_boxed(t)) for t in texts]
        lengths.add(len(tried))
        for i, text in enumerate(texts[1:], start=1):
            left = [x for x in PROBLEM.candidates if x not in tried[:i]]
            assert tried[i] == left[0], (tried, text)
            assert text.startswith(f"Tried {', '.join(map(str, tried[:i]))}. Left {', '.join(map(str, left))}. ")
    assert lengths == {1, 2, 3}
    assert build.next_candidate(PROBLEM, (27, 22)) == 14
    assert build.next_candidate(PROBLEM, (9, 14)) == 27
    assert build.next_candidate(PROBLEM, (14, 27, 9)) == 22
    assert build.next_candidate(PROBLEM, (14, 27, 9, 22)) == 22  # all tried: the last one again
    assert PROBLEM.worked_answer(22, (14, 27, 9)).startswith("Tried 14, 27, 9. Left 22. 22 * 7")
    assert PROBLEM.worked_answer(22, (14, 27, 9, 22)).startswith("Tried 14, 27, 9, 22. 22 * 7")  # none left


def test_the_evaluator_recomputes_the_check_and_is_right_at_its_accuracy(build):
    rng = random.Random(1)
    right = []
    for _ in range(2000):
        problem = make_mod_search_problem(rng)
        x = rng.choice(problem.candidates)
        review = build.search_review(problem, x, rng, accuracy=0.9)
        said_correct = extract_boxed(review) == "Correct"
        right.append(said_correct == problem.accepts(x))
        assert review.startswith(" ".join(problem.check_lines(x)[:2]))  # the product and the sum, re-written
        total = x * problem.multiplier + problem.offset
        residual = total - problem.target
        assert f" {total} - {problem.target} = {residual}. {residual} mod {problem.modulus} = " in review
        stated = int(review.split(f"{residual} mod {problem.modulus} = ")[1].split(".")[0])
        assert (stated == 0) == said_correct  # the verdict follows the one number before it
        assert stated == residual % problem.modulus or said_correct != problem.accepts(x)  # a slip only when wrong
    assert abs(sum(right) / len(right) - 0.9) < 0.02


def test_judges_pick_the_right_voter_when_there_is_one(build):
    """Voting's aggregator reads the voters' remainders; where a right candidate is among them it picks it at the
    judge accuracy, far above a random pick."""
    workflow = WORKFLOWS["voting"]()
    rng = random.Random(2)
    picked_right, chance = [], []
    for seed in range(600):
        problem = make_mod_search_problem(rng)
        final, records = episode(build, workflow, problem, seed)
        voters = [int(extract_boxed(t)) for role, _, t in records if role == "generator"]
        if any(problem.accepts(x) for x in voters) and not all(problem.accepts(x) for x in voters):
            picked_right.append(problem.accepts(int(extract_boxed(final))))
            chance.append(sum(problem.accepts(x) for x in voters) / len(voters))
    assert sum(picked_right) / len(picked_right) > sum(chance) / len(chance) + 0.3


def test_a_search_build_keeps_the_decision_carrying_calls_more_than_once(build):
    """Every evaluator call and every retry of the search transcripts is kept SEARCH_DECISION_REPEATS times (first
    attempts and other solver calls are sampled as before), so the build's loss sees the two decisions more."""
    records = build.transcripts(0, seed=4, n_search_problems=40)
    counts = Counter(id(record) for record in records)  # a kept call, repeated: the same record again
    by_id = {id(record): record for record in records}
    repeats = build.SEARCH_DECISION_REPEATS
    decisions = {
        key: n for key, n in counts.items() if by_id[key][0] == "evaluator" or by_id[key][2].startswith("Tried ")
    }
    assert repeats > 1 and decisions and set(decisions.values()) == {repeats}
    assert {n for key, n in counts.items() if key not in decisions} == {1}
    retries = sum(1 for role, _, t in records if role == "generator" and t.startswith("Tried "))
    first = sum(1 for role, _, t in records if role == "generator" and not t.startswith("Tried "))
    assert retries / repeats > 0.25 * first  # all kept: about 1.1 retries per problem, first attempts at SOLVER_KEEP
