"""The judged best-of-n baseline: n SA-RL samples, each judged by a trained Eval-Opt evaluator as it judges a first
attempt, the majority among the accepted answers graded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tiny import tiny_trainer

from trl_multiagent import EvalOpt, SingleAgent, Voting
from trl_multiagent.evaluation import EvalSettings, evaluate, family_table
from trl_multiagent.evaluation.best_of import judged_choice, select
from trl_multiagent.evaluation.judged import JudgedSamples
from trl_multiagent.evaluation.results import result_key

MATH = [{"role": "user", "content": "What is 2 + 3?"}]
SAMPLED = dict(task="math", dataset_name="arithmetic", limit=2, max_completion_length=6, k=2, temperature=1.0)


def test_the_judge_chooses_the_majority_of_what_it_accepts():
    assert judged_choice(["5", "4", "4", "6"], [True, False, False, True]) == 0  # 4 is the majority, but rejected
    assert judged_choice(["5", "4", "6", "4"], [False, True, True, True]) == 1  # among the accepted, 4 twice
    assert judged_choice(["5", "4", "4"], [False, False, False]) == 1  # none accepted: the majority of all
    assert judged_choice([None, "4"], [True, False]) == 0  # an accepted sample without an answer is still chosen
    with pytest.raises(ValueError, match="one verdict per sample: 2 answers, 1 verdicts"):
        judged_choice(["4", "5"], [True])
    with pytest.raises(ValueError, match="use judged_choice"):
        select(["4"], "judge")


def test_each_sample_is_judged_as_the_evaluator_judges_a_first_attempt():
    judge = EvalOpt(max_iterations=3)
    workflow = JudgedSamples(SingleAgent(), judge, n=3)
    samples = iter(["\\boxed{6}", "\\boxed{5}", "\\boxed{5}"])
    calls = []

    async def generate(role, messages, *, instance=0):
        calls.append((role, instance, messages))
        if role == "generator":
            return next(samples)
        verdict = "Correct" if "\\boxed{5}" in messages[-2]["content"] else "Incorrect"
        return f"\\boxed{{{verdict}}}"

    answer = asyncio.run(workflow.run(MATH, generate))
    assert answer == "\\boxed{5}"
    generator = [(instance, messages) for role, instance, messages in calls if role == "generator"]
    evaluator = [(instance, messages) for role, instance, messages in calls if role == "evaluator"]
    solve = SingleAgent()._prompts.render("solve", problem="What is 2 + 3?", request="What is 2 + 3?")
    assert generator == [(i, [{"role": "user", "content": solve}]) for i in range(3)]  # the sampler's own prompt
    sampled = ["\\boxed{6}", "\\boxed{5}", "\\boxed{5}"]
    assert evaluator == [(i, judge.review_request(MATH, sampled[i])) for i in range(3)]
    assert workflow.parallel == {"generator": 3, "evaluator": 3}
    assert workflow.config_dict()["judge"] == judge.config_dict()
    with pytest.raises(ValueError, match="Voting, which has no role that judges one answer"):
        JudgedSamples(SingleAgent(), Voting(), n=3)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """A tiny SA-RL run and a tiny Eval-Opt run (isolated) on the same base model, two steps each."""
    root = tmp_path_factory.mktemp("judged")
    settings = dict(max_completion_length=6, max_steps=2, save_steps=2, learning_rate=5e-2, seed=3)
    tiny_trainer(tiny_model_dir, root / "single_agent", SingleAgent(), **settings).train()
    tiny_trainer(
        tiny_model_dir, root / "eval_opt", EvalOpt(max_iterations=2), policy_sharing="isolated", **settings
    ).train()
    return root


def test_a_judged_evaluation_of_tiny_runs(runs, tmp_path):
    sa_rl, eval_opt = runs / "single_agent", runs / "eval_opt"
    settings = EvalSettings(**SAMPLED, best_of=2, select="judge", judge=str(eval_opt))
    (row,) = evaluate(sa_rl, "trained", settings, output_dir=tmp_path)
    assert (row["best_of"], row["select"], row["mean_calls"]) == (2, "judge", 4.0)  # 2 samples and 2 verdicts
    assert row["workflow"] == "SingleAgent" and "role_policies" not in row  # a line of SA-RL's in the table
    assert row["judge"] == str((eval_opt / "checkpoint-2").resolve())  # the judge run's newest checkpoint
    assert row["judge_of"] == {"run": "eval_opt", "workflow": "EvalOpt", "policy_sharing": "isolated", "step": 2}
    assert 0 <= row["judge_accepted"] <= 1 and 0 <= row["judge_agreement"] <= 1 and 0 <= row["sample_accuracy"] <= 1
    judge = EvalOpt(max_iterations=2)
    for path in Path(row["episodes_dir"]).glob("*.json"):
        episode = json.loads(path.read_text())
        roles = sorted(call["role"] for call in episode["calls"])
        assert roles == ["evaluator", "evaluator", "generator", "generator"]
        samples = {call["instance"]: call["output"] for call in episode["calls"] if call["role"] == "generator"}
        for call in (c for c in episode["calls"] if c["role"] == "evaluator"):
            assert call["messages"] == judge.review_request(episode["row"]["prompt"], samples[call["instance"]])
            assert call["adapter"].startswith("evaluator-")  # the Eval-Opt run's evaluator, loaded beside SA-RL's
    majority = EvalSettings(**SAMPLED, best_of=2)
    (voted,) = evaluate(sa_rl, "trained", majority, output_dir=tmp_path)
    assert result_key(voted) != result_key(row)
    assert evaluate(sa_rl, "trained", settings, output_dir=tmp_path) == []  # recorded: skipped
    labels = [line["label"] for line in family_table([row, voted], bootstrap=10)["lines"]]
    assert labels == ["SA-RL best-of-2 (judge: EvalOpt isolated)", "SA-RL best-of-2 (majority)"]


def test_a_judge_must_be_an_eval_opt_run_and_the_sampler_an_sa_rl_run(runs, tmp_path):
    sa_rl, eval_opt = runs / "single_agent", runs / "eval_opt"
    with pytest.raises(ValueError, match="select='judge' and judge go together"):
        EvalSettings(**SAMPLED, best_of=2, select="judge")
    with pytest.raises(ValueError, match="select='judge' and judge go together"):
        EvalSettings(**SAMPLED, best_of=2, judge=str(eval_opt))
    with pytest.raises(ValueError, match="was trained as SingleAgent; the judge must be an Eval-Opt run"):
        evaluate(
            sa_rl, "trained", EvalSettings(**SAMPLED, best_of=2, select="judge", judge=str(sa_rl)), output_dir=tmp_path
        )
    with pytest.raises(ValueError, match="needs n > 1 samples"):
        evaluate(sa_rl, "trained", EvalSettings(**SAMPLED, select="judge", judge=str(eval_opt)), output_dir=tmp_path)
    judged = EvalSettings(**SAMPLED, best_of=2, select="judge", judge=str(eval_opt))
    with pytest.raises(ValueError, match="best_of samples one agent several times; trained mode runs EvalOpt"):
        evaluate(eval_opt, "trained", judged, output_dir=tmp_path)
