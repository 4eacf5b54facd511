"""Evaluation: pass@k, the paper's table, instability summaries, and evaluating runs in every mode."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import ROOT, run_offline
from presets import evaluation_settings, preset
from tiny import tiny_trainer

from trl_multiagent import SingleAgent, Voting
from trl_multiagent.evaluation import (
    EvalSettings,
    evaluate,
    format_table,
    paper_table,
    pass_at_k,
    read_results,
    role_instability,
)
from trl_multiagent.evaluation.results import problem_success

TINY_EVAL = dict(task="math", dataset_name="arithmetic", limit=2, max_completion_length=6)


def test_pass_at_k_hand_computed():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 4) == 1.0  # any correct sample among all n
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def row(step, accuracy, workflow="Voting", sharing="isolated", mode="trained", **extra):
    return dict(
        step=step,
        accuracy=accuracy,
        workflow=workflow,
        policy_sharing=sharing,
        mode=mode,
        model="m",
        dataset="d",
        k=1,
        trained_workflow=None if mode == "base" else "SingleAgent" if mode == "transfer" else workflow,
        **extra,
    )


def test_paper_table_from_eval_results(tmp_path):
    rows = [
        row(0, 0.20, sharing=None, mode="base"),
        row(5, 0.30),
        row(10, 0.50),
        row(15, 0.40),
        row(20, 0.35),  # peak 50 at 10, final 35: drop 15
        row(5, 0.40, sharing="shared"),
        row(10, 0.40, sharing="shared"),  # flat: the earliest step is the peak
        row(5, 0.35, mode="transfer"),
        row(10, 0.45, mode="transfer"),  # SA-RL in Voting: peak 45
        row(5, 0.42, workflow="SingleAgent"),
        row(10, 0.38, workflow="SingleAgent"),
        row(5, 0.10, workflow="EvalOpt"),
        row(10, 0.60, workflow="EvalOpt"),  # no transfer row: vs SA-RL alone
    ]
    (tmp_path / "eval_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = {(e["workflow"], e["policy_sharing"], e["mode"]): e for e in paper_table(read_results(tmp_path))}

    isolated = table["Voting", "isolated", "trained"]
    assert (isolated["peak"], isolated["peak_step"], isolated["final"], isolated["final_step"]) == (0.5, 10, 0.35, 20)
    assert isolated["drop_pp"] == pytest.approx(15.0)
    assert isolated["residual_pp"] == pytest.approx(5.0) and isolated["residual_vs"] == "transfer"
    assert isolated["vs_base_pp"] == pytest.approx(30.0)
    shared = table["Voting", "shared", "trained"]
    assert (shared["peak_step"], shared["drop_pp"], shared["residual_pp"]) == (5, 0.0, pytest.approx(-5.0))
    eval_opt = table["EvalOpt", "isolated", "trained"]
    assert eval_opt["residual_pp"] == pytest.approx(18.0) and eval_opt["residual_vs"] == "single_agent"
    assert eval_opt["vs_base_pp"] is None  # no base row for EvalOpt
    assert table["SingleAgent", "isolated", "trained"]["residual_pp"] is None
    assert "| m | d | Voting | isolated | trained | 50.0 (10) | 35.0 (20) | 15.0 | +5.0 | +30.0 |" in format_table(
        paper_table(rows)
    )


def test_role_instability_tolerates_missing_metrics():
    history = [
        {"step": 1, "role/generator/policy_ratio": 1.0, "role/generator/entropy": 2.0, "loss": 0.1},
        {"step": 2, "role/generator/policy_ratio": 3.0, "role/generator/entropy": 0.5, "role/aggregator/grad_norm": 4},
        {"step": 3, "role/generator/policy_ratio": 2.0, "role/generator/entropy": 1.0, "role/aggregator/grad_norm": 1},
    ]
    summary = role_instability(history)
    generator = summary["generator"]
    assert (generator["policy_ratio_max"], generator["policy_ratio_max_step"]) == (3.0, 2)
    assert generator["policy_ratio_growth"] == 3.0
    assert (generator["entropy_collapse"], generator["entropy_change"]) == (1.5, -1.0)
    assert "grad_norm_max" not in generator
    assert summary["aggregator"] == {"grad_norm_max": 4.0, "grad_norm_max_step": 2}
    assert role_instability([]) == {}


# The reference evaluates checkpoints at its eval lengths (dashboard/task_configs.py: math 8192, code 5120 tokens per
# call) unless `--use-training-lengths` (math 5120, code 2048), as its evaluate_checkpoints.py resolves them.
REFERENCE_EVAL_LENGTHS = {"math": 8192, "code": 5120}
REFERENCE_TRAINING_LENGTHS = {"math": 5120, "code": 2048}


@pytest.mark.parametrize("task", ["math", "code"])
def test_paper_evaluation_lengths_are_the_references(task):
    paper = evaluation_settings("--task", task, "--device", "cpu")  # as recipes/evaluate.py runs without --config
    assert paper.max_completion_length == REFERENCE_EVAL_LENGTHS[task]
    assert (paper.temperature, paper.chat_template_kwargs) == (0.7, {"enable_thinking": False})
    training = evaluation_settings("--task", task, "--use_training_lengths", "--device", "cpu")
    assert training.max_completion_length == REFERENCE_TRAINING_LENGTHS[task]
    assert training.max_completion_length == preset(f"paper_{task}")["max_completion_length"]  # the training preset's
    given = evaluation_settings("--task", task, "--use_training_lengths", "--max_completion_length", "77")
    assert given.max_completion_length == 77  # an explicit length wins, as --max-tokens does there


def train(model_dir, output_dir, workflow, policy_sharing="isolated"):
    settings = dict(max_completion_length=6, max_steps=2, save_steps=1, learning_rate=5e-2, seed=3)
    tiny_trainer(model_dir, output_dir, workflow, policy_sharing=policy_sharing, **settings).train()
    return output_dir


@pytest.fixture(scope="module")
def voting_run(tiny_model_dir, tmp_path_factory):
    return train(tiny_model_dir, tmp_path_factory.mktemp("voting"), Voting())


def test_evaluating_a_run_twice_appends_nothing(voting_run):
    settings = EvalSettings(**TINY_EVAL, k=2, temperature=0.7)
    first = evaluate(voting_run, "trained", settings)
    assert [r["step"] for r in first] == [1, 2]
    for r in first:
        assert (r["mode"], r["workflow"], r["policy_sharing"], r["k"], r["dataset"]) == (
            "trained",
            "Voting",
            "isolated",
            2,
            "arithmetic",
        )
        assert 0.0 <= r["accuracy"] <= r["pass_at_k"] <= 1.0
    lines = (voting_run / "eval_results.jsonl").read_text()
    assert evaluate(voting_run, "trained", settings) == []
    assert (voting_run / "eval_results.jsonl").read_text() == lines
    assert len(evaluate(voting_run, "trained", EvalSettings(**TINY_EVAL))) == 2  # other settings: a new key

    episodes = sorted(Path(first[1]["episodes_dir"]).glob("*.json"))
    assert Path(first[1]["episodes_dir"]).parent.name == "step-2" and len(episodes) == 2 * 2
    episode = json.loads(episodes[0].read_text())
    roles = [(c["role"], c["instance"]) for c in episode["calls"]]
    assert roles == [("generator", 0), ("generator", 1), ("generator", 2), ("aggregator", 0)]
    call = episode["calls"][-1]
    assert call["messages"][0]["role"] == "user" and isinstance(call["output"], str)
    assert set(call["parsed"]) == {"kind", "value", "parsed"} and call["parsed"]["kind"] == "selection"
    assert 1 <= call["parsed"]["value"] <= 3 and call["reward"] == episode["reward"]
    assert episode["row"]["answer"]


def test_rows_record_each_problems_successes_and_final_only_evaluates_the_newest(voting_run, tmp_path):
    settings = EvalSettings(**TINY_EVAL, k=3, temperature=1.0, seed=5)
    (row,) = evaluate(voting_run, "trained", settings, output_dir=tmp_path, final_only=True)
    assert row["step"] == 2  # checkpoint-1 is not evaluated
    assert len(row["problem_solved"]) == 2 and all(0 <= count <= 3 for count in row["problem_solved"])
    assert sum(row["problem_solved"]) / 6 == pytest.approx(row["accuracy"])
    from_episodes = problem_success({k: v for k, v in row.items() if k != "problem_solved"})  # a row recorded before
    assert problem_success(row) == from_episodes == [count / 3 for count in row["problem_solved"]]


def test_transfer_and_generator_alone(tiny_model_dir, voting_run, tmp_path):
    sa_run = train(tiny_model_dir, tmp_path / "sa", SingleAgent())
    settings = EvalSettings(**TINY_EVAL)
    transfer = evaluate(sa_run, "transfer", settings, workflow=Voting())
    assert [r["role_to_adapter"] for r in transfer] == [{"generator": "generator", "aggregator": "generator"}] * 2
    assert transfer[0]["workflow"] == "Voting" and transfer[0]["trained_workflow"] == "SingleAgent"
    alone = evaluate(voting_run, "generator_alone", settings, output_dir=tmp_path / "alone")
    assert [(r["workflow"], r["role_to_adapter"]) for r in alone] == [("SingleAgent", {"generator": "generator"})] * 2
    with pytest.raises(ValueError, match="holds"):
        evaluate(voting_run, "transfer", settings, workflow=Voting())  # two adapters: which one?


@pytest.mark.slow
def test_base_mode_through_the_script(tiny_model_dir, tmp_path):
    command = [
        sys.executable,
        "recipes/evaluate.py",
        "--mode",
        "base",
        "--workflow",
        "eval_opt",
        "--base_model",
        tiny_model_dir,
        "--output_dir",
        str(tmp_path),
        "--dataset_name",
        "arithmetic",
        "--limit",
        "2",
        "--max_completion_length",
        "6",
        "--device",
        "cpu",
    ]
    result = run_offline(command, cwd=ROOT)
    (base,) = read_results(tmp_path)
    assert (base["mode"], base["step"], base["workflow"], base["policy_sharing"]) == ("base", 0, "EvalOpt", None)
    assert base["temperature"] == 0.7  # the script's defaults are the paper's: sampled, thinking off
    assert base["chat_rendering"] == "reference_qwen"  # and prompts rendered as the reference renders them
    assert base["role_to_adapter"] == {"generator": "__base__", "evaluator": "__base__"}
    assert 2 <= base["mean_calls"] <= 6  # EvalOpt: 2 .. 2 x max_iterations calls
    assert "| EvalOpt | - | base |" in result.stdout
