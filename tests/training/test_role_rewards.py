"""Per-role rewards: the reference's definitions read from the roles' declared formats, and their advantages
normalised per prompt, role and instance."""

from __future__ import annotations

import math
import re

import pytest
import torch
from reference_rules import reference_advantages, reference_role_rewards, right
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from tiny import tiny_config, tiny_trainer, train_recording
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt, OrchWorkers, SingleAgent, Voting
from trl_multiagent.rollout.engine import RolloutEngine
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.role_rewards import builtin_role_rewards, outcome_scorer


def call(role: str, text: str, instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [{"role": "user", "content": "q"}], [1], [2], text, False)


ROWS = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}]
SCORE = outcome_scorer([boxed_answer_reward], [1.0])


def test_evaluator_is_rewarded_when_its_verdict_matches_the_attempt_it_judged():
    episode = Episode(
        0,
        [
            call("generator", "\\boxed{5}"),
            call("evaluator", "\\boxed{Correct}"),  # wrong attempt praised: 0
            call("generator", "\\boxed{4}"),
            call("evaluator", "\\boxed{Incorrect}"),  # right attempt rejected: 0
            call("generator", "\\boxed{4}"),
            call("evaluator", "\\boxed{Correct}"),  # right attempt praised: 1
        ],
        "\\boxed{4}",
    )
    rewards = builtin_role_rewards("reference", EvalOpt(), [episode], ROWS, [1.0], SCORE)
    assert rewards == [[0.0, 0.0, 1.0, 0.0, 1.0, 1.0]]  # generator: its own answer; evaluator: its verdict


def test_aggregator_is_rewarded_for_the_answer_it_picked_and_a_plan_for_the_outcome():
    voting = Episode(
        0,
        [
            call("generator", "\\boxed{5}", 0),
            call("generator", "\\boxed{4}", 1),
            call("generator", "\\boxed{3}", 2),
            call("aggregator", "\\boxed{2}"),
        ],
        "\\boxed{4}",
    )
    assert builtin_role_rewards("reference", Voting(), [voting], ROWS, [1.0], SCORE) == [[0.0, 1.0, 0.0, 1.0]]
    orch = Episode(
        0,
        [
            call("orchestrator", "STRATEGY 1: add"),
            call("worker", "\\boxed{4}", 0),
            call("synthesizer", "\\boxed{5}"),
        ],
        "\\boxed{5}",
    )
    assert builtin_role_rewards("own_answers", OrchWorkers(), [orch], ROWS, [0.0], SCORE) == [[0.0, 1.0, 0.0]]


CODE = "```python\nprint(input())\n```"


@pytest.mark.parametrize("passed", [True, False])
def test_reference_code_workflows_grade_every_role_by_the_final_program(passed):
    """The reference's code Eval-Opt rewards every attempt with the final program's test result and compares every
    verdict with it (deepcoder_evaluator_optimizer_workflow.py:423-442); its code Voting gives every role the selected
    program's result (deepcoder_voting_workflow.py:323-355)."""
    verdicts = ["\\boxed{Incorrect}", "no verdict", "\\boxed{Correct}"]
    calls = [c for v in verdicts for c in (call("generator", CODE), call("evaluator", v))]
    episode = Episode(0, calls, CODE)

    def reference_reward(role: str, text: str) -> float:  # the reference's rule, restated
        if role == "generator":
            return float(passed)
        verdict = re.search(r"\\boxed\{(Correct|Incorrect)\}", text, re.IGNORECASE)
        verdict = verdict.group(1).lower() if verdict else "unknown"
        return float((verdict == "correct" and passed) or (verdict == "incorrect" and not passed))

    outcome = [1.0 if passed else 0.0]
    expected = [[reference_reward(c.role, c.text) for c in calls]]
    assert builtin_role_rewards("reference", EvalOpt(task="code"), [episode], ROWS, outcome, SCORE) == expected
    voting = Episode(0, [*(call("generator", CODE, i) for i in range(3)), call("aggregator", "\\boxed{2}")], CODE)
    rewards = builtin_role_rewards("reference", Voting(task="code"), [voting], ROWS, outcome, SCORE)
    assert rewards == [[float(passed)] * 4]


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
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        dataset=addition_dataset(4),
        respond=scripted_eval_opt,
        policy_sharing="isolated",
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        role_rewards="reference",
    )
    batches, episodes = train_recording(trainer)
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


def scripted_roles(requests, rng) -> list[str]:
    """Every role of the built-in math workflows, at random: answers right or wrong, verdicts Correct, Incorrect or
    none, a pick among three, one to three strategies."""
    outputs = []
    for request in requests:
        i = int(re.search(r"What is (\d+) \+ 2", " ".join(m["content"] for m in request.messages)).group(1))
        if request.adapter == "evaluator":
            outputs.append(rng.choice(["\\boxed{Correct}", "\\boxed{Incorrect}", "Looks fine to me."]))
        elif request.adapter == "aggregator":
            outputs.append(f"\\boxed{{{rng.randint(1, 3)}}}")
        elif request.adapter == "orchestrator":
            outputs.append("\n".join(f"STRATEGY {k}: solve it by method {k}" for k in range(1, rng.randint(1, 3) + 1)))
        else:
            outputs.append(f"\\boxed{{{i + 2 if rng.random() < 0.5 else i + 3}}}")
    return outputs


def own_answers_role_rewards(episode, answer: str) -> list[float]:
    """Our variant, written out: the reference's except workers by their own answers, the orchestrator by the
    episode's outcome, and an unreadable verdict read as Incorrect."""
    reference = reference_role_rewards(episode, answer)
    rewards, attempt = [], None
    for call, value in zip(episode.calls, reference):
        if call.role == "worker":
            value = float(right(call.text, answer))
        elif call.role == "orchestrator":
            value = float(right(episode.final_answer, answer))
        elif call.role == "evaluator":
            value = float(("\\boxed{Correct}" in call.text) == right(attempt, answer))
        attempt = call.text if call.role == "generator" else attempt
        rewards.append(value)
    return rewards


@pytest.mark.parametrize(
    "workflow", [SingleAgent(), Voting(), EvalOpt(max_iterations=3), OrchWorkers()], ids=lambda w: type(w).__name__
)
def test_builtin_role_rewards_are_the_references_and_own_answers_ours(tiny_model_dir, workflow):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    routes = {role: role for role in workflow.roles}
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 2?"}], "answer": str(i + 2)} for i in range(4)] * 6
    episodes = RolloutEngine(workflow, ScriptedBackend(tokenizer, scripted_roles, seed=3), routes).run(
        [row["prompt"] for row in rows]
    )
    outcome = [float(right(e.final_answer, row["answer"])) for e, row in zip(episodes, rows)]
    reference = builtin_role_rewards("reference", workflow, episodes, rows, outcome, SCORE)
    assert reference == [reference_role_rewards(e, row["answer"]) for e, row in zip(episodes, rows)]
    own = builtin_role_rewards("own_answers", workflow, episodes, rows, outcome, SCORE)
    assert own == [own_answers_role_rewards(e, row["answer"]) for e, row in zip(episodes, rows)]
    if isinstance(workflow, (EvalOpt, OrchWorkers)):  # where the variants part: zeroed roles, unreadable verdicts
        assert own != reference
    assert {0.0, 1.0} <= {r for per_episode in reference for r in per_episode}


def test_role_rewards_choices_are_checked(tmp_path):
    with pytest.raises(ValueError, match="own_answers"):
        tiny_config(tmp_path, role_rewards="per_role")
    with pytest.raises(ValueError, match="own_answers"):
        builtin_role_rewards("per_role", EvalOpt(), [], [], [], SCORE)


@pytest.mark.parametrize("role_rewards", [None, "reference"])
def test_trainer_advantages_under_the_paper_groups_are_the_references(tiny_model_dir, tmp_path, role_rewards):
    # The paper preset's grouping (advantage_groups="calls") through the trainer, with outcome rewards (the
    # reference's use_final_outcome_reward=True) or the reference's per-role ones: every call's advantage is verl's
    # over the reference's uids.
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=3),
        dataset=addition_dataset(4),
        respond=scripted_roles,
        policy_sharing="isolated",
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        advantage_groups="calls",
        role_rewards=role_rewards,
    )
    batches, episodes = train_recording(trainer)
    answers = [re.search(r"What is (\d+)", e.calls[0].messages[-1]["content"]).group(1) for e in episodes]
    answers = [str(int(a) + 2) for a in answers]
    if role_rewards is None:
        scores = [float(right(e.final_answer, a)) for e, a in zip(episodes, answers) for _ in e.calls]
    else:
        scores = [r for e, a in zip(episodes, answers) for r in reference_role_rewards(e, a)]
    expected = reference_advantages(episodes, trainer.num_generations, "eval_opt", scores)
    assert batches[0].advantages.tolist() == pytest.approx(expected, abs=1e-5)
    assert max(len(e.calls) for e in episodes) > 2 and len({round(a, 4) for a in expected}) > 1


class StrictJudgeReward:
    """A user's evaluator reward (TRL's signature plus the per-role context): 1 for rejecting a wrong attempt, 0.5
    for accepting a right one, 0 otherwise; records what it was given."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, judged, candidates, final_answer, answer, **columns):
        self.calls.append(dict(completions=completions, judged=judged, answer=answer, final_answer=final_answer))
        rewards = []
        for verdict, attempt, expected in zip(completions, judged, answer):
            if "Incorrect" in verdict:
                rewards.append(float(not right(attempt, expected)))
            else:
                rewards.append(0.5 * right(attempt, expected))
        return rewards


def test_a_role_reward_func_scores_that_roles_calls_and_sets_their_advantages(tiny_model_dir, tmp_path):
    """`role_reward_funcs={"evaluator": fn}`: fn gets the evaluator's calls of the batch (each with the attempt it
    judged and its row's columns); under `advantage_groups="calls"` the evaluator's samples carry fn's rewards
    normalised per prompt, while the generator, without a function, keeps the outcome reward."""
    judge = StrictJudgeReward()
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        dataset=addition_dataset(4),
        respond=scripted_eval_opt,
        policy_sharing="isolated",
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        advantage_groups="calls",
        role_reward_funcs={"evaluator": judge},
    )
    batches, episodes = train_recording(trainer)

    answers = [
        str(int(re.search(r"What is (\d+)", e.calls[0].messages[-1]["content"]).group(1)) + 2) for e in episodes
    ]
    verdicts = [(e, i) for e, ep in enumerate(episodes) for i, c in enumerate(ep.calls) if c.role == "evaluator"]
    (given,) = judge.calls  # once for the batch, with the evaluator's calls only, in order
    assert given["completions"] == [episodes[e].calls[i].text for e, i in verdicts]
    assert given["judged"] == [episodes[e].calls[i - 1].text for e, i in verdicts]  # the attempt just before
    assert given["answer"] == [answers[e] for e, _ in verdicts]
    assert given["final_answer"] == [episodes[e].final_answer for e, _ in verdicts]

    judged = dict(zip(verdicts, judge(**{**given, "prompts": [], "completion_ids": [], "candidates": []})))
    scores = [
        judged[e, i] if call.role == "evaluator" else float(right(episode.final_answer, answers[e]))
        for e, episode in enumerate(episodes)
        for i, call in enumerate(episode.calls)
    ]
    assert {judged[key] for key in verdicts} >= {0.0, 1.0}  # the judge's rewards differ, so its advantages do
    expected = reference_advantages(episodes, trainer.num_generations, "eval_opt", scores)
    assert batches[0].advantages.tolist() == pytest.approx(expected, abs=1e-5)
    logs = trainer.state.log_history[0]
    assert logs["role/evaluator/role_reward"] == pytest.approx(sum(judged.values()) / len(judged))
    assert "role/generator/role_reward" not in logs  # no function for it: the outcome, not a role reward
