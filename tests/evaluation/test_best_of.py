"""The cost-matched SA-RL baseline: best-of-n samples of a single agent, the majority answer graded as an episode's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets import Dataset

from trl_multiagent import SingleAgent, Voting
from trl_multiagent.evaluation import EvalSettings, evaluate, evaluator
from trl_multiagent.evaluation.best_of import majority_vote, matched_best_of, select
from trl_multiagent.evaluation.results import problem_success, result_key
from trl_multiagent.rollout.records import Episode, ModelCall

TINY_EVAL = dict(task="math", dataset_name="arithmetic", limit=2, max_completion_length=6)


def test_majority_vote_ties_and_unparseable_answers():
    assert majority_vote(["5", "4", "4"]) == 1  # the first sample of the most frequent answer
    assert majority_vote(["4", "5", "5", "4"]) == 0  # a tie: the answer that appears first
    assert majority_vote(["5", "4", "4", "5"]) == 0
    assert majority_vote([None, None, "4"]) == 2  # unparseable answers do not vote, however many
    assert majority_vote([None, None, None]) == 0  # nothing to count: the first sample, graded as it stands
    assert majority_vote(["1 /  2", "0.5", "1 / 2"]) == 0  # whitespace aside, answers are compared as written
    assert majority_vote(["1/2", "0.5", "0.5", "1/2"]) == 0
    with pytest.raises(ValueError, match="at least one"):
        majority_vote([])
    with pytest.raises(ValueError, match="the selections are majority, judge"):
        select(["4"], "vote")


def fake_episodes(texts_by_problem):
    """``sample_episodes`` over fixed outputs: one generator call per sample, problem-major."""

    def sample_episodes(trained, rows, settings, backend=None, *, role_tools=None):
        chunk, episodes = [], []
        for problem, texts in enumerate(texts_by_problem):
            assert len(texts) == settings.k * settings.best_of
            for sample, text in enumerate(texts):
                call = ModelCall("generator", 0, "generator", [], [1], [1, 2], text, False)
                chunk.append((problem, sample))
                episodes.append(Episode(len(episodes), [call], text))
        yield chunk, episodes

    return sample_episodes


def test_each_episode_is_the_majority_of_n_samples_graded_by_the_task(monkeypatch):
    texts = [
        # answer 4: [5, 4, 4] -> 4 right; [4, 5, no box] -> tie, 4 first: right
        ["\\boxed{5}", "\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{5}", "4"],
        # answer 7: [3, 7, " 3 "] -> 3 wrong; nothing parseable -> the first sample: wrong
        ["\\boxed{3}", "\\boxed{7}", "\\boxed{ 3 }", "seven", "7", "is 7"],
        # answer 9: [9, -, -] -> 9 right; [8, 9, 8] -> 8 wrong
        ["\\boxed{9}", "x", "y", "\\boxed{8}", "\\boxed{9}", "\\boxed{8}"],
    ]
    monkeypatch.setattr(evaluator, "sample_episodes", fake_episodes(texts))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "?"}], "answer": a} for a in "479"])
    settings = EvalSettings(task="math", k=2, temperature=0.7, best_of=3)
    result = evaluator.score(SimpleNamespace(workflow=SingleAgent(task="math")), dataset, settings)
    assert result["problem_solved"] == [2, 0, 1]  # episodes (majorities) solved out of k = 2
    assert result["accuracy"] == pytest.approx(3 / 6) and result["pass_at_k"] == pytest.approx(2 / 3)
    assert result["mean_calls"] == 3  # per episode: its n samples' calls
    assert result["sample_accuracy"] == pytest.approx(6 / 18)  # the samples graded one by one
    assert problem_success({"k": 2, **result}) == [1.0, 0.0, 0.5]  # what the bootstrap reads

    one_each = EvalSettings(task="math", k=6, temperature=0.7)  # the same 18 samples as episodes of their own
    plain = evaluator.score(SimpleNamespace(workflow=SingleAgent(task="math")), dataset, one_each)
    assert plain["problem_solved"] == [3, 1, 2] and "sample_accuracy" not in plain


def test_best_of_needs_sampling_and_a_known_selection():
    with pytest.raises(ValueError, match="identical samples; set temperature > 0"):
        EvalSettings(task="math", best_of=3)
    with pytest.raises(ValueError, match="best_of must be >= 1"):
        EvalSettings(task="math", best_of=0)
    with pytest.raises(ValueError, match="select must be one of"):
        EvalSettings(task="math", best_of=2, temperature=0.7, select="vote")


LIKE = dict(task="math", dataset="arithmetic", num_problems=2, k=2, temperature=1.0, top_p=1.0)
LIKE |= dict(max_completion_length=6, seed=42)


def test_n_is_the_workflows_newest_measured_calls_rounded_up():
    rows = [
        {**LIKE, "mode": "trained", "workflow": "EvalOpt", "step": 10, "mean_calls": 4.5},
        {**LIKE, "mode": "trained", "workflow": "EvalOpt", "step": 30, "mean_calls": 2.25},
        {**LIKE, "mode": "trained", "workflow": "EvalOpt", "step": 40, "mean_calls": 6.0, "temperature": 0.0},
        {**LIKE, "mode": "trained", "workflow": "EvalOpt", "step": 50, "mean_calls": 6.0, "role_policies": "x=base"},
    ]
    n, row = matched_best_of(rows, LIKE, "runs/eval_opt")
    assert (n, row["step"]) == (3, 30)  # the newest with the same settings; 2.25 calls -> 3 samples
    assert matched_best_of([{**rows[1], "mean_calls": 3.0}], LIKE, "r")[0] == 3  # exactly 3 stays 3
    with pytest.raises(ValueError, match="runs/eval_opt has no evaluation .* seed=7: evaluate it first"):
        matched_best_of(rows, {**LIKE, "seed": 7}, "runs/eval_opt")


def test_a_best_of_evaluation_of_the_tiny_model(tiny_model_dir, tmp_path):
    """Real generation: the base model as SA-RL, n read from a workflow's recorded evaluation."""
    workflow_run = tmp_path / "eval_opt-isolated"
    workflow_run.mkdir()
    recorded = {**LIKE, "mode": "trained", "workflow": "EvalOpt", "step": 30, "mean_calls": 2.4}
    (workflow_run / "eval_results.jsonl").write_text(json.dumps(recorded) + "\n")
    settings = EvalSettings(**TINY_EVAL, k=2, temperature=1.0)
    base = dict(workflow=SingleAgent(), base_model=tiny_model_dir, output_dir=tmp_path / "sa")
    (row,) = evaluate(None, "base", settings, best_of_calls=workflow_run, **base)
    assert (row["best_of"], row["select"], row["k"], row["mean_calls"]) == (3, "majority", 2, 3.0)
    matched = {"run": None, "workflow": "EvalOpt", "policy_sharing": None, "step": 30, "mean_calls": 2.4}
    assert row["best_of_calls_of"] == matched
    assert len(row["problem_solved"]) == 2 and sum(row["problem_solved"]) / 4 == pytest.approx(row["accuracy"])
    assert len(list(Path(row["episodes_dir"]).glob("*.json"))) == 2 * 2 * 3  # every sample kept
    assert result_key(row) != result_key({k: v for k, v in row.items() if k not in ("best_of", "select")})
    # the same evaluation with n given: already recorded, skipped
    assert evaluate(None, "base", EvalSettings(**TINY_EVAL, k=2, temperature=1.0, best_of=3), **base) == []
    with pytest.raises(ValueError, match="give one of the two"):
        evaluate(None, "base", EvalSettings(**TINY_EVAL, k=2, temperature=1.0, best_of=3), **base, best_of_calls="x")
    voting = {**base, "workflow": Voting()}
    with pytest.raises(ValueError, match="best_of samples one agent several times; base mode runs Voting"):
        evaluate(None, "base", EvalSettings(**TINY_EVAL, temperature=1.0, best_of=3), **voting)
