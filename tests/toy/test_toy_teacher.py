"""The scripted teacher of scripts/build_toy_model.py: its transcripts are what the toy model learns, so they must
follow every role's format, make greedy decoding miss on the confusable operations, and let judges beat chance."""

from __future__ import annotations

import random
import re
from collections import Counter

from trl_multiagent.evaluation.toy import WORKFLOWS, follows_format
from trl_multiagent.tasks.arithmetic import make_arithmetic_problem


def test_every_transcript_target_follows_its_role_format(build):
    records = build.transcripts(200, seed=1)
    assert {role for role, _, _ in records} == {
        "generator",
        "evaluator",
        "aggregator",
        "orchestrator",
        "worker",
        "synthesizer",
    }
    workflow_of = {role: workflow for workflow in (build() for build in WORKFLOWS.values()) for role in workflow.roles}
    broken = [(role, target) for role, _, target in records if not follows_format(workflow_of[role], role, target)]
    assert broken == []


def test_confusable_operations_are_the_mode_so_greedy_decoding_misses(build):
    """On "-", "*" and "/" the confused operation is written more often than the right one; on "+" the right one."""
    rng = random.Random(0)
    written = {op: Counter() for op in "+-*/"}
    for _ in range(3000):
        problem, _ = make_arithmetic_problem(rng)
        _, ops = build.operations(problem)
        solution = build.solve(problem, rng)
        op, _ = ops[0]  # the first line has no restart error
        written[op][re.match(r"\d+ (\S) \d+", solution.lines[0]).group(1)] += 1
    for op, counts in written.items():
        confused = build.CONFUSED_OPERATION[op]
        if op == "+":
            assert counts[op] > 2 * counts[confused], counts
        else:
            assert counts[confused] > counts[op], (op, counts)


def test_judges_check_candidates_and_pick_right_above_chance(build):
    """Aggregator/synthesizer targets cite each checked candidate's lines; on candidates that disagree, the pick is
    right far more often than a random pick."""
    rng = random.Random(0)
    picked_right, chance = [], []
    while len(picked_right) < 400:
        problem, _ = make_arithmetic_problem(rng)
        candidates = [build.solve(problem, rng) for _ in range(3)]
        right = [c.wrong_step is None for c in candidates]
        checks, pick = build.compare(candidates, problem, rng)
        for j, candidate in enumerate(candidates[: pick + 1]):
            assert f"Solution {j + 1}: Step 1 (" in checks and candidate.lines[0] in checks
        assert checks.endswith("Checks out.") and f"Solution {pick + 2}:" not in checks
        if any(right) and not all(right):
            picked_right.append(right[pick])
            chance.append(sum(right) / len(right))
    accuracy, baseline = sum(picked_right) / len(picked_right), sum(chance) / len(chance)
    assert accuracy > baseline + 0.2, (accuracy, baseline)


def test_every_code_transcript_target_follows_its_role_format(build):
    records = build.transcripts(0, seed=1, n_code_problems=150)
    assert {role for role, _, _ in records} == {
        "generator",
        "evaluator",
        "aggregator",
        "orchestrator",
        "worker",
        "synthesizer",
    }
    workflow_of = {role: w for w in (make("code") for make in WORKFLOWS.values()) for role in w.roles}
    broken = [(role, target) for role, _, target in records if not follows_format(workflow_of[role], role, target)]
    assert broken == []
    assert all("```python\n" in target for role, _, target in records if role in ("generator", "worker"))


def test_code_bugs_are_the_mode_on_four_kinds_and_programs_are_graded_by_their_tests(build):
    """On sum_two, vowels, count_up and times_k a bug is written more often than the reference (greedy misses); on
    the other kinds the reference is the mode. ``right`` is what running the tests says, not what was intended."""
    rng = random.Random(0)
    modal_bug = {"sum_two", "vowels", "count_up", "times_k"}
    for kind in sorted(build.CODE_BUGS):
        written = Counter()
        for _ in range(400):
            problem = build.CodeProblem(kind, rng)
            program = problem.solve(rng)
            written["reference" if program.wrong_line is None else program.finding.split(" ")[0]] += 1
            if program.wrong_line is None:
                assert program.right
        top = written.most_common(1)[0][0]
        assert (top != "reference") == (kind in modal_bug), (kind, written)
    wrong = build.CodeProblem("times_k", random.Random(1))
    assert not wrong.program("print(input() * 3)", "missing int conversion").right
    assert wrong.program(wrong.reference, None).right


def test_code_judges_quote_lines_and_beat_chance(build):
    rng = random.Random(0)
    verdicts, picked_right, chance = [], [], []
    while len(picked_right) < 400:
        problem = build.CodeProblem(rng.choice(sorted(build.CODE_BUGS)), rng)
        candidates = [problem.solve(rng) for _ in range(3)]
        review = build.code_review(problem, candidates[0], rng)
        assert review.startswith(f"Line 1: {candidates[0].lines[0]} - ")
        verdicts.append(("boxed{Correct}" in review) == candidates[0].right)
        right = [c.right for c in candidates]
        checks, pick = build.code_compare(problem, candidates, rng)
        assert checks.endswith("checks out.") and f"Solution {pick + 2}:" not in checks
        if any(right) and not all(right):
            picked_right.append(right[pick])
            chance.append(sum(right) / len(right))
    assert abs(sum(verdicts) / len(verdicts) - build.JUDGE_ACCURACY) < 0.05
    accuracy, baseline = sum(picked_right) / len(picked_right), sum(chance) / len(chance)
    assert accuracy > baseline + 0.2, (accuracy, baseline)
