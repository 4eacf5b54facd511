"""The per-family table: final success over seeds with their spread, and each trained workflow's residual against
SA-RL with a paired bootstrap interval over problems, from fabricated result rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trl_multiagent.evaluation import family_table, format_family_table
from trl_multiagent.evaluation.bootstrap import paired_difference

GREEDY = dict(k=1, temperature=0.0, top_p=1.0, max_completion_length=80, num_problems=4, dataset="arithmetic")


def row(mode, workflow, seed, solved, step=30, sharing=None, **extra):
    settings = {**GREEDY, **extra}
    k = settings["k"]
    return {
        "run": f"{workflow}-{sharing}",
        "mode": mode,
        "workflow": workflow,
        "policy_sharing": sharing,
        "step": step,
        "seed": seed,
        **settings,
        "accuracy": sum(solved) / (k * len(solved)),
        "problem_solved": solved,
    }


# Per problem, episodes solved (greedy: 0 or 1) on 4 problems, two seeds.
ROWS = [
    row("trained", "SingleAgent", 1, [1, 0, 0, 0], sharing="isolated"),
    row("trained", "SingleAgent", 2, [1, 1, 0, 0], sharing="isolated"),
    row("trained", "EvalOpt", 1, [0, 0, 0, 0], step=10, sharing="isolated"),  # an older checkpoint: not the newest
    row("trained", "EvalOpt", 1, [1, 1, 1, 0], sharing="isolated"),
    row("trained", "EvalOpt", 2, [1, 1, 1, 1], sharing="isolated"),
    row("trained", "EvalOpt", 1, [0, 0, 0, 0], sharing="isolated") | {"role_policies": "evaluator=base"},
    row("transfer", "EvalOpt", 1, [1, 1, 0, 0], sharing="isolated"),
    row("transfer", "EvalOpt", 2, [1, 1, 0, 0], sharing="isolated"),
    row("base", "EvalOpt", 1, [0, 1, 0, 0], step=0),
    row("base", "EvalOpt", 2, [0, 1, 0, 0], step=0),
    row("trained", "EvalOpt", 1, [2, 1, 0, 1], sharing="isolated", k=2, temperature=0.7),  # one seed sampled
    row("trained", "SingleAgent", 1, [1, 0, 0, 0], sharing="isolated", k=2, temperature=0.7),
]


def test_means_spread_and_residuals_by_hand():
    table = family_table(ROWS, bootstrap=500, seed=3)
    assert [s["label"] for s in table["settings"]] == ["greedy", "pass@1 k=2 T=0.7"]
    lines = {line["label"]: line for line in table["lines"]}
    assert list(lines) == ["SA-RL", "EvalOpt", "SA-RL in EvalOpt", "base model, EvalOpt"]
    sa, eval_opt = lines["SA-RL"]["results"]["greedy"], lines["EvalOpt"]["results"]["greedy"]
    assert sa["mean"] == pytest.approx(0.375) and sa["std"] == pytest.approx(0.125 * 2**0.5)  # 0.25, 0.5
    assert eval_opt["mean"] == pytest.approx(0.875) and eval_opt["steps"] == [30]  # 0.75, 1.0: step 10 left out
    assert eval_opt["std"] == pytest.approx(0.125 * 2**0.5)
    # seeds pooled per problem: EvalOpt [1, 1, 1, .5], SA-RL [1, .5, 0, 0], SA-RL in EvalOpt [1, 1, 0, 0]
    residual = eval_opt["vs_single_agent"]
    assert residual["value"] == pytest.approx(0.5) and residual["seeds"] == [1, 2]
    assert eval_opt["vs_transfer"]["value"] == pytest.approx(0.375)
    assert sa["vs_single_agent"] is None and lines["base model, EvalOpt"]["results"]["greedy"]["vs_transfer"] is None

    # the interval: the same resamplings of the 4 problems, drawn directly
    difference = np.array([0.0, 0.5, 1.0, 0.5])
    rng = np.random.default_rng(3)
    draws = [difference[rng.integers(0, 4, 4)].mean() for _ in range(500)]
    low, high = np.percentile(draws, [2.5, 97.5])
    assert (residual["low"], residual["high"]) == pytest.approx((low, high))
    assert residual["low"] < residual["value"] < residual["high"]

    sampled = lines["EvalOpt"]["results"]["pass@1 k=2 T=0.7"]
    assert sampled["mean"] == pytest.approx(0.5) and sampled["std"] is None and sampled["seeds"] == [1]
    assert sampled["vs_single_agent"]["value"] == pytest.approx(0.5 - 0.125)  # [1, .5, 0, .5] - [.5, 0, 0, 0]
    assert sampled["vs_transfer"] is None  # no sampled SA-RL in EvalOpt

    text = format_family_table("arithmetic on toy", table)
    assert "| EvalOpt | isolated | 30 | 87.5 ± 17.7 | +50.0 [" in text
    assert "| SA-RL | - | 30 | 37.5 ± 17.7 | - | - |" in text
    assert "| 50.0 (seeds 1) | +37.5 [" in text  # fewer seeds than the table's: named
    assert "seed(s) 1, 2" in text and "95% paired bootstrap interval over problems" in text


def test_a_four_problem_interval_known_by_hand():
    # differences [1, 1, 0, 0]: a resampling draws only zeros (or only ones) with probability 1/16 > 2.5%,
    # so the 95% interval is [0, 1] whatever the seed
    result = paired_difference([1, 1, 0, 1], [0, 0, 0, 1], bootstrap=1000, seed=11)
    assert result == {"value": 0.5, "low": 0.0, "high": 1.0}
    with pytest.raises(ValueError, match="same problems"):
        paired_difference([1, 0], [1, 0, 1])


def test_rows_without_per_problem_successes_read_their_episodes_or_say_what_is_missing(tmp_path):
    rows = [dict(r) for r in ROWS if r["temperature"] == 0]
    sa_seed_1 = rows[0]
    episodes = tmp_path / "episodes"
    episodes.mkdir()
    for problem, solved in enumerate(sa_seed_1.pop("problem_solved")):  # a row recorded before problem_solved
        record = {"problem": problem, "sample": 0, "reward": float(solved)}
        (episodes / f"problem-{problem:05d}-sample-00.json").write_text(json.dumps(record))
    sa_seed_1["episodes_dir"] = str(episodes)
    table = family_table(rows, bootstrap=200)
    eval_opt = next(line for line in table["lines"] if line["label"] == "EvalOpt")["results"]["greedy"]
    assert eval_opt["vs_single_agent"]["value"] == pytest.approx(0.5) and not table["notes"]

    del rows[1]["problem_solved"]  # SA-RL seed 2: neither the field nor episode files
    table = family_table(rows, bootstrap=200)
    eval_opt = next(line for line in table["lines"] if line["label"] == "EvalOpt")["results"]["greedy"]
    assert eval_opt["vs_single_agent"]["value"] is None and eval_opt["vs_transfer"]["value"] == pytest.approx(0.375)
    assert len(table["notes"]) == 1 and "seed 2" in table["notes"][0]
    assert "? (no per-problem outcomes)" in format_family_table("arithmetic", table)


SAMPLED = dict(k=1, temperature=0.7)


def test_the_cost_matched_line_and_each_workflows_residual_against_it():
    rows = [
        row("trained", "SingleAgent", 1, [1, 0, 0, 0], sharing="isolated", **SAMPLED),
        row("trained", "SingleAgent", 2, [1, 1, 0, 0], sharing="isolated", **SAMPLED),
        # 2.5 and 2.2 calls per episode: matched with best-of-3 at both seeds
        row("trained", "EvalOpt", 1, [1, 1, 1, 0], sharing="isolated", **SAMPLED) | {"mean_calls": 2.5},
        row("trained", "EvalOpt", 2, [1, 1, 1, 1], sharing="isolated", **SAMPLED) | {"mean_calls": 2.2},
        # 4.0 calls at seed 1, 5.0 at seed 2 (no best-of-5): matched at seed 1 only
        row("trained", "Voting", 1, [1, 1, 1, 1], sharing="shared", **SAMPLED) | {"mean_calls": 4.0},
        row("trained", "Voting", 2, [1, 1, 1, 1], sharing="shared", **SAMPLED) | {"mean_calls": 5.0},
        row("trained", "SingleAgent", 1, [1, 1, 0, 0], **SAMPLED) | {"best_of": 3, "select": "majority"},
        row("trained", "SingleAgent", 2, [1, 1, 1, 0], **SAMPLED) | {"best_of": 3, "select": "majority"},
        row("trained", "SingleAgent", 1, [0, 1, 0, 0], **SAMPLED) | {"best_of": 4, "select": "majority"},
        row("generator_alone", "SingleAgent", 1, [0, 0, 0, 0], **SAMPLED) | {"best_of": 3, "select": "majority"},
    ]
    table = family_table(rows, bootstrap=200, seed=1)
    lines = {line["label"]: line for line in table["lines"]}
    assert list(lines) == ["SA-RL", "SA-RL best-of-3 (majority)", "SA-RL best-of-4 (majority)", "EvalOpt", "Voting"]
    sa = lines["SA-RL"]["results"]["pass@1 k=1 T=0.7"]
    assert sa["mean"] == pytest.approx(0.375)  # best-of rows do not replace SA-RL's own
    best_of = lines["SA-RL best-of-3 (majority)"]
    described = (best_of["mode"], best_of["workflow"], best_of["best_of"], best_of["select"])
    assert described == ("trained", "SingleAgent", 3, "majority")
    # pooled per problem: best-of-3 [1, 1, .5, 0], SA-RL [1, .5, 0, 0]
    assert best_of["results"]["pass@1 k=1 T=0.7"]["vs_single_agent"]["value"] == pytest.approx(0.25)
    eval_opt = lines["EvalOpt"]["results"]["pass@1 k=1 T=0.7"]["vs_best_of"]
    assert eval_opt["value"] == pytest.approx(0.25) and eval_opt["seeds"] == [1, 2] and eval_opt["n"] == [3, 3]
    voting = lines["Voting"]["results"]["pass@1 k=1 T=0.7"]["vs_best_of"]
    assert voting["value"] == pytest.approx(0.75) and voting["seeds"] == [1] and voting["n"] == [4]

    text = format_family_table("mod_search on toy", table)
    assert "| line | sharing | step | pass@1 k=1 T=0.7 % | vs SA-RL pp | vs SA-RL in workflow pp | " in text
    assert "| vs SA-RL best-of-n pp |" in text
    assert "| SA-RL best-of-3 (majority) | - | 30 | 62.5 ± 17.7 | +25.0 [" in text
    assert "| SA-RL best-of-4 (majority) | - | 30 | 25.0 (seeds 1) | +0.0 [" in text
    eval_opt_line = next(line for line in text.splitlines() if line.startswith("| EvalOpt |"))
    assert "| - | +25.0 [" in eval_opt_line and eval_opt_line.endswith("] (n=3) |")  # no SA-RL in EvalOpt here
    assert "measured model calls per episode rounded up" in text

    without = [r for r in rows if "best_of" not in r]
    plain = family_table(without, bootstrap=200, seed=1)
    assert all("vs_best_of" not in r for line in plain["lines"] for r in line["results"].values())
    assert "best-of" not in format_family_table("mod_search on toy", plain)


def test_a_judged_best_of_is_matched_with_the_workflow_whose_judge_chose():
    judged_by = {
        sharing: {"run": f"EvalOpt-{sharing}", "workflow": "EvalOpt", "policy_sharing": sharing, "step": 30}
        for sharing in ("shared", "isolated")
    }
    judged = {"best_of": 3, "select": "judge"}
    rows = [
        row("trained", "SingleAgent", 1, [1, 0, 0, 0], sharing="isolated", **SAMPLED),
        row("trained", "EvalOpt", 1, [1, 1, 1, 0], sharing="isolated", **SAMPLED) | {"mean_calls": 2.5},
        row("trained", "EvalOpt", 1, [1, 1, 1, 1], sharing="shared", **SAMPLED) | {"mean_calls": 2.2},
        row("trained", "SingleAgent", 1, [1, 1, 0, 0], **SAMPLED) | {"best_of": 3, "select": "majority"},
        # the same 3 samples judged by each EvalOpt's own evaluator: isolated accepts better answers than shared
        row("trained", "SingleAgent", 1, [1, 1, 1, 0], **SAMPLED) | judged | {"judge_of": judged_by["isolated"]},
        row("trained", "SingleAgent", 1, [1, 0, 0, 0], **SAMPLED) | judged | {"judge_of": judged_by["shared"]},
    ]
    table = family_table(rows, bootstrap=200, seed=1)
    lines = {(line["label"], line["policy_sharing"]): line for line in table["lines"]}
    assert [label for label, _ in lines] == [
        "SA-RL",
        "SA-RL best-of-3 (judge: EvalOpt isolated)",
        "SA-RL best-of-3 (judge: EvalOpt shared)",
        "SA-RL best-of-3 (majority)",
        "EvalOpt",
        "EvalOpt",
    ]
    judge_line = lines[("SA-RL best-of-3 (judge: EvalOpt isolated)", None)]
    assert (judge_line["select"], judge_line["judge_workflow"], judge_line["judge_policy_sharing"]) == (
        "judge",
        "EvalOpt",
        "isolated",
    )
    isolated = lines[("EvalOpt", "isolated")]["results"]["pass@1 k=1 T=0.7"]
    shared = lines[("EvalOpt", "shared")]["results"]["pass@1 k=1 T=0.7"]
    assert isolated["vs_best_of"]["value"] == pytest.approx(0.25)  # against the majority of the same n
    assert isolated["vs_judged_best_of"]["value"] == pytest.approx(0.0)  # against its own judge's choice
    assert shared["vs_judged_best_of"]["value"] == pytest.approx(0.75) and shared["vs_judged_best_of"]["n"] == [3]

    text = format_family_table("mod_search on toy", table)
    assert "| vs SA-RL best-of-n pp | vs SA-RL judged best-of-n pp |" in text
    isolated_line = next(line for line in text.splitlines() if line.startswith("| EvalOpt | isolated |"))
    assert isolated_line.endswith("| +25.0 [+0.0, +75.0] (n=3) | +0.0 [+0.0, +0.0] (n=3) |")
    assert "each judged by the workflow's own trained evaluator" in text
