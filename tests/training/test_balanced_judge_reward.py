"""role_rewards="balanced": a judge's verdicts class-balanced over the batch, so that repeating the base rate earns
0.5, not the share of right attempts."""

from __future__ import annotations

import pytest
from scripted import addition_dataset, boxed_answer_reward
from tiny import tiny_config, tiny_trainer
from training.test_role_rewards import scripted_eval_opt

from trl_multiagent import EvalOpt, Voting
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.role_rewards import balanced_weights, builtin_role_rewards, outcome_scorer

ROWS = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}]
SCORE = outcome_scorer([boxed_answer_reward], [1.0])
CORRECT, INCORRECT = "\\boxed{Correct}", "\\boxed{Incorrect}"


def call(role: str, text: str) -> ModelCall:
    return ModelCall(role, 0, role, [{"role": "user", "content": "q"}], [1], [2], text, False)


def judged(attempts: list[str], verdicts: list[str]) -> list[Episode]:
    """One Eval-Opt episode per attempt: the generator's answer, then the evaluator's verdict on it."""
    return [
        Episode(e, [call("generator", a), call("evaluator", v)], a) for e, (a, v) in enumerate(zip(attempts, verdicts))
    ]


def rewards(variant: str, attempts: list[str], verdicts: list[str]) -> list[list[float]]:
    episodes = judged(attempts, verdicts)
    outcome = [float(a == "\\boxed{4}") for a in attempts]
    return builtin_role_rewards(variant, EvalOpt(), episodes, ROWS * len(episodes), outcome, SCORE)


ATTEMPTS = ["\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{5}"]  # three right, one wrong


def test_a_judge_repeating_the_base_rate_earns_one_half():
    always = [CORRECT] * 4
    reference = rewards("reference", ATTEMPTS, always)
    balanced = rewards("balanced", ATTEMPTS, always)
    assert [r[1] for r in reference] == [1.0, 1.0, 1.0, 0.0]  # mean 0.75: the share of right attempts
    # n = 4 verdicts, C = 2 truths, 3 on right attempts, 1 on a wrong one: weights 4 / (2 * 3) and 4 / (2 * 1)
    assert [r[1] for r in balanced] == pytest.approx([2 / 3, 2 / 3, 2 / 3, 0.0])
    assert sum(r[1] for r in balanced) / 4 == pytest.approx(0.5)  # the balanced accuracy of "always Correct"
    assert [r[0] for r in balanced] == [r[0] for r in reference] == [1.0, 1.0, 1.0, 0.0]  # answers unchanged


def test_a_judge_catching_the_rare_wrong_attempt_earns_most_for_it():
    balanced = rewards("balanced", ATTEMPTS, [CORRECT, CORRECT, CORRECT, INCORRECT])
    assert [r[1] for r in balanced] == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert sum(r[1] for r in balanced) / 4 == pytest.approx(1.0)
    unreadable = rewards("balanced", ATTEMPTS, [CORRECT, "no verdict", CORRECT, INCORRECT])
    assert [r[1] for r in unreadable] == pytest.approx([2 / 3, 0.0, 2 / 3, 2.0])  # graded (wrong), still counted


def test_one_truth_in_the_batch_is_the_reference_reward():
    right_only = ["\\boxed{4}"] * 3
    verdicts = [CORRECT, INCORRECT, CORRECT]
    assert rewards("balanced", right_only, verdicts) == rewards("reference", right_only, verdicts)
    assert balanced_weights([True, True, False, True]) == pytest.approx([2 / 3, 2 / 3, 2.0, 2 / 3])
    assert balanced_weights([False, False]) == [1.0, 1.0]


def test_workflows_without_judges_get_the_reference_rewards():
    calls = [*(call("generator", f"\\boxed{{{k}}}") for k in (5, 4, 3)), call("aggregator", "\\boxed{2}")]
    voting = Episode(0, calls, "\\boxed{4}")
    assert builtin_role_rewards("balanced", Voting(), [voting], ROWS, [1.0], SCORE) == builtin_role_rewards(
        "reference", Voting(), [voting], ROWS, [1.0], SCORE
    )


def test_the_trainer_logs_the_balanced_judge_reward(tiny_model_dir, tmp_path):
    assert tiny_config(tmp_path, role_rewards="balanced").role_rewards == "balanced"
    settings = dict(policy_sharing="isolated", max_steps=1, logging_steps=1, save_strategy="no")
    workflow, dataset = EvalOpt(max_iterations=2), addition_dataset(4)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        workflow,
        dataset=dataset,
        respond=scripted_eval_opt,
        role_rewards="balanced",
        **settings,
    )
    episodes, run = [], trainer.engine.run
    trainer.engine.run = lambda prompts: episodes.extend(run(prompts)) or episodes[-len(prompts) :]
    trainer.train()
    truths, right = [], []  # by hand: the evaluator's verdicts and the truth of each attempt it judged
    for episode in episodes:
        answer = str(int(episode.calls[0].messages[0]["content"].split("What is ")[1].split(" ")[0]) + 2)
        for i, c in enumerate(episode.calls):
            if c.role == "evaluator":
                truths.append(answer in episode.calls[i - 1].text)
                right.append((c.text == CORRECT) == truths[-1])
    assert len(set(truths)) == 2  # both kinds of attempt were judged
    per_class = [sum(r for r, t in zip(right, truths) if t == c) / truths.count(c) for c in (True, False)]
    balanced_accuracy = sum(per_class) / 2
    logged = trainer.state.log_history[0]["role/evaluator/role_reward"]
    assert logged == pytest.approx(balanced_accuracy, abs=1e-6)
