"""Per-role rewards: the reference's definitions read from the roles' declared formats, and their advantages
normalised per prompt, role and instance."""

from __future__ import annotations

import math

import pytest
import torch
from scripted import addition_dataset, boxed_answer_reward
from tiny import tiny_trainer

from trl_multiagent import EvalOpt, OrchWorkers, Voting
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.role_rewards import builtin_role_rewards, outcome_scorer


def call(role: str, text: str, instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [{"role": "user", "content": "q"}], [1], [2], text, False)


ROWS = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}]
SCORE = outcome_scorer([boxed_answer_reward], [1.0])


def test_evaluator_is_rewarded_when_its_verdict_matches_the_attempt_it_judged():
    episode = Episode(0, [
        call("generator", "\\boxed{5}"), call("evaluator", "\\boxed{Correct}"),    # wrong attempt praised: 0
        call("generator", "\\boxed{4}"), call("evaluator", "\\boxed{Incorrect}"),  # right attempt rejected: 0
        call("generator", "\\boxed{4}"), call("evaluator", "\\boxed{Correct}"),    # right attempt praised: 1
    ], "\\boxed{4}")  # fmt: skip
    rewards = builtin_role_rewards("reference", EvalOpt(), [episode], ROWS, [1.0], SCORE)
    assert rewards == [[0.0, 0.0, 1.0, 0.0, 1.0, 1.0]]  # generator: its own answer; evaluator: its verdict


def test_aggregator_is_rewarded_for_the_answer_it_picked_and_a_plan_for_the_outcome():
    voting = Episode(0, [
        call("generator", "\\boxed{5}", 0), call("generator", "\\boxed{4}", 1), call("generator", "\\boxed{3}", 2),
        call("aggregator", "\\boxed{2}"),
    ], "\\boxed{4}")  # fmt: skip
    assert builtin_role_rewards("reference", Voting(), [voting], ROWS, [1.0], SCORE) == [[0.0, 1.0, 0.0, 1.0]]
    orch = Episode(0, [
        call("orchestrator", "STRATEGY 1: add"), call("worker", "\\boxed{4}", 0), call("synthesizer", "\\boxed{5}"),
    ], "\\boxed{5}")  # fmt: skip
    assert builtin_role_rewards("own_answers", OrchWorkers(), [orch], ROWS, [0.0], SCORE) == [[0.0, 1.0, 0.0]]


def scripted_eval_opt(requests, rng):
    """Generators answer right for even problems; the evaluator (adapter "evaluator") says Correct at random."""
    outputs = []
    for request in requests:
        if request.adapter == "evaluator":
            outputs.append(rng.choice(["\\boxed{Correct}", "\\boxed{Incorrect}"]))
        else:
            text = " ".join(m["content"] for m in request.messages)
            i = int(text.split("What is ")[1].split(" ")[0])
            outputs.append(f"\\boxed{{{i + 2 if rng.random() < 0.5 else i + 3}}}")
    return outputs


def test_evaluator_advantages_are_its_verdict_rewards_normalised_per_prompt(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, EvalOpt(max_iterations=2), dataset=addition_dataset(4), respond=scripted_eval_opt,
        policy_sharing="isolated", max_steps=1, logging_steps=1, save_strategy="no", role_rewards="reference",
    )  # fmt: skip
    batches, episodes = [], []
    score, run = trainer._generate_and_score_completions, trainer.engine.run
    trainer._generate_and_score_completions = lambda inputs: batches.append(score(inputs)) or batches[-1]
    trainer.engine.run = lambda prompts: episodes.extend(run(prompts)) or episodes[-len(prompts) :]
    trainer.train()
    batch = batches[0]
    right, every_verdict = {}, []  # verdict reward by hand: Correct iff the attempt just before it is right
    for e, episode in enumerate(episodes):
        answer = str(int(episode.calls[0].messages[0]["content"].split("What is ")[1].split(" ")[0]) + 2)
        verdicts = [
            float((c.text == "\\boxed{Correct}") == (answer in episode.calls[i - 1].text))
            for i, c in enumerate(episode.calls)
            if c.role == "evaluator"
        ]
        right[e] = sum(verdicts) / len(verdicts)  # one trajectory per episode: its calls pooled
        every_verdict += verdicts
    expected = {}
    for e in right:  # one group per prompt (4 episodes), mean and unbiased std, eps 1e-6
        group = torch.tensor([right[g] for g in range(e // 4 * 4, e // 4 * 4 + 4)], dtype=torch.float64)
        expected[e] = float((right[e] - group.mean()) / (group.std() + 1e-6))
    got = [
        (int(ep), float(a)) for r, ep, a in zip(batch.roles, batch.episode_ids, batch.advantages) if r == "evaluator"
    ]
    assert got and all(a == pytest.approx(expected[e], abs=1e-5) for e, a in got)
    assert len({round(a, 6) for _, a in got}) > 1  # verdicts differ in quality, so advantages differ
    logs = trainer.state.log_history[0]
    assert math.isclose(logs["role/evaluator/role_reward"], sum(every_verdict) / len(every_verdict), abs_tol=1e-9)
