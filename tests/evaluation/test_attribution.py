"""Per-role attribution: Shapley arithmetic on fixed tables, the bootstrap over problems, and the cache of evaluated
subsets on a tiny run."""

from __future__ import annotations

import itertools
import json
import sys

import pytest
from harness import ROOT, run_offline
from tiny import tiny_trainer

from trl_multiagent import Voting
from trl_multiagent.evaluation import EvalSettings, evaluate, read_results
from trl_multiagent.evaluation.attribution import (
    attribution,
    coalitions,
    format_attribution,
    interaction,
    run_attribution,
    shapley,
)

S = frozenset
# v(subset of trained adapters): success rates of a three-role game
GAME = {
    S(): 0.2,
    S("a"): 0.5,
    S("b"): 0.3,
    S("c"): 0.2,
    S("ab"): 0.7,
    S("ac"): 0.5,
    S("bc"): 0.4,
    S("abc"): 0.9,
}


def test_exact_shapley_by_hand():
    shares = shapley(GAME, ["a", "b", "c"])
    # a: 1/3 (0.5-0.2) + 1/6 (0.7-0.3) + 1/6 (0.5-0.2) + 1/3 (0.9-0.4) = 23/60
    # b: 1/3 (0.3-0.2) + 1/6 (0.7-0.5) + 1/6 (0.4-0.2) + 1/3 (0.9-0.5) = 14/60
    # c: 1/3 (0.2-0.2) + 1/6 (0.5-0.5) + 1/6 (0.4-0.3) + 1/3 (0.9-0.7) = 5/60
    assert shares == pytest.approx({"a": 23 / 60, "b": 14 / 60, "c": 5 / 60})
    assert sum(shares.values()) == pytest.approx(GAME[S("abc")] - GAME[S()])  # efficiency
    assert interaction(GAME, ["a", "b", "c"]) == pytest.approx(0.7 - (0.3 + 0.1 + 0.0))


def test_two_roles_split_their_interaction_equally():
    game = {S(): 0.1, S("g"): 0.3, S("e"): 0.1, S("ge"): 0.6}  # the evaluator helps only a trained generator
    assert shapley(game, ["g", "e"]) == pytest.approx({"g": 0.2 + 0.15, "e": 0.0 + 0.15})
    assert interaction(game, ["g", "e"]) == pytest.approx(0.3)


def test_more_than_four_roles_use_add_one_in_and_leave_one_out():
    players = list("abcde")
    weights = dict(zip(players, [0.05, 0.1, 0.0, 0.2, 0.02]))
    pairs = {("a", "b"): 0.04, ("c", "d"): -0.06, ("b", "e"): 0.02}

    def v(subset):
        return 0.1 + sum(weights[p] for p in subset) + sum(i for (x, y), i in pairs.items() if {x, y} <= subset)

    needed = coalitions(players)
    assert len(needed) == 2 + 2 * 5  # not 2^5
    shares = shapley({c: v(c) for c in needed}, players)
    # pairwise interactions only: Shapley = own weight + half of each interaction the player is in
    exact = {p: weights[p] + sum(i / 2 for pair, i in pairs.items() if p in pair) for p in players}
    assert shares == pytest.approx(exact)
    full = {S(c) for size in range(6) for c in itertools.combinations(players, size)}
    assert len(coalitions(players[:4])) == 16 and set(coalitions(players[:4])) <= full


def per_problem_game(n):
    """Per problem: 0/1 outcomes. The generator alone solves half of the problems; the evaluator adds nothing."""
    half = [float(i % 2 == 0) for i in range(n)]
    return {S(): [0.0] * n, S(["generator"]): half, S(["evaluator"]): [0.0] * n, S(["generator", "evaluator"]): half}


def test_bootstrap_interval_covers_the_sampling_spread():
    result = attribution(per_problem_game(200), ["generator", "evaluator"], bootstrap=2000, seed=1)
    generator, evaluator = result["shares"]["generator"], result["shares"]["evaluator"]
    assert generator["value"] == pytest.approx(0.5) and evaluator == {"value": 0.0, "low": 0.0, "high": 0.0}
    # the share is a mean of 200 coin flips: standard error 0.035, a 95% interval about +-0.07
    assert 0.41 < generator["low"] < 0.47 and 0.53 < generator["high"] < 0.59
    assert result["gain"]["value"] == pytest.approx(0.5) and result["interaction"]["value"] == pytest.approx(0.0)
    again = attribution(per_problem_game(200), ["generator", "evaluator"], bootstrap=2000, seed=1)
    assert again == result  # seeded


def test_identical_problems_leave_no_spread_and_missing_subsets_are_named():
    table = {c: [GAME[c]] * 10 for c in GAME}
    result = attribution(table, ["a", "b", "c"], bootstrap=50)
    assert result["shares"]["a"] == pytest.approx({"value": 23 / 60, "low": 23 / 60, "high": 23 / 60})
    assert [s["success"] for s in result["subsets"]] == pytest.approx(
        [GAME[S(s["trained"])] for s in result["subsets"]]
    )
    with pytest.raises(ValueError, match=r"needs the subsets \[\['a', 'b'\]\]"):
        attribution({c: v for c, v in table.items() if c != S("ab")}, ["a", "b", "c"])


@pytest.fixture(scope="module")
def voting_run(tiny_model_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("voting")
    settings = dict(max_completion_length=6, max_steps=2, save_steps=1, learning_rate=5e-2, seed=3)
    tiny_trainer(tiny_model_dir, output_dir, Voting(), policy_sharing="isolated", **settings).train()
    return output_dir


def test_subsets_already_evaluated_are_read_not_run(voting_run, tmp_path):
    settings = EvalSettings(task="math", dataset_name="arithmetic", limit=3, max_completion_length=6, temperature=0)
    (plain,) = evaluate(voting_run / "checkpoint-2", "trained", settings, output_dir=tmp_path)  # the full subset
    first = run_attribution(voting_run, settings, output_dir=tmp_path, bootstrap=100)
    assert first["evaluated"] == 3  # 2^2 subsets, the all-trained one was there
    assert (first["step"], first["players"], first["method"]) == (2, ["generator", "aggregator"], "shapley")
    rows = read_results(tmp_path)
    assert sorted(row.get("role_policies") or "" for row in rows) == [
        "",
        "aggregator=base",
        "aggregator=base,generator=base",
        "generator=base",
    ]
    by_trained = {tuple(s["trained"]): s["success"] for s in first["subsets"]}
    assert by_trained[("aggregator", "generator")] == pytest.approx(plain["accuracy"])
    for row in rows:  # per-problem outcomes read back from the episodes give each row's accuracy
        trained = tuple(sorted(a for a in row["role_to_adapter"].values() if a != "__base__"))
        assert by_trained[tuple(sorted(set(trained)))] == pytest.approx(row["accuracy"])
    lines = (tmp_path / "eval_results.jsonl").read_text()
    second = run_attribution(voting_run, settings, output_dir=tmp_path, bootstrap=100)
    assert second["evaluated"] == 0 and (tmp_path / "eval_results.jsonl").read_text() == lines
    assert {**second, "evaluated": 3} == first
    saved = json.loads((tmp_path / f"attribution-step2-{first['settings_key']}.json").read_text())
    assert saved["shares"] == first["shares"]
    table = format_attribution(first)
    assert "| generator (generator) |" in table and "| interaction |" in table


@pytest.mark.slow
def test_attribution_through_the_script(voting_run, tmp_path):
    command = [
        sys.executable,
        "recipes/evaluate.py",
        "--run_dir",
        str(voting_run),
        "--output_dir",
        str(tmp_path),
        "--attribution",
        "--bootstrap",
        "50",
        "--dataset_name",
        "arithmetic",
        "--limit",
        "2",
        "--max_completion_length",
        "6",
        "--temperature",
        "0",
        "--device",
        "cpu",
    ]
    result = run_offline(command, cwd=ROOT)
    assert len(read_results(tmp_path)) == 4
    assert "| aggregator (aggregator) |" in result.stdout and "| gain (all trained - all base) |" in result.stdout
