"""A judge that gives the common verdict instead of judging: its per-role balanced accuracy, and the judge_base_rate
alarm on scripted log sequences. No model."""

from __future__ import annotations

import logging

import pytest
from monitoring.test_monitoring import eval_opt_batch, math_checker, normal_log, replay

from trl_multiagent.monitoring import DriftThresholds, RoleDriftCallback, workflow_metrics
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.workflows import EvalOpt


def call(role: str, text: str) -> ModelCall:
    return ModelCall(role, 0, role, [{"role": "user", "content": "q"}], [1], [2], text, False)


def always_correct(answers: list[str]) -> list[Episode]:
    return [Episode(e, [call("generator", a), call("evaluator", r"\boxed{Correct}")]) for e, a in enumerate(answers)]


def test_a_judge_saying_correct_always_has_raw_accuracy_but_balanced_accuracy_one_half():
    episodes = always_correct([r"\boxed{4}", r"\boxed{4}", r"\boxed{4}", r"\boxed{5}"])
    m = workflow_metrics(EvalOpt(), episodes, [1.0, 1.0, 1.0, 0.0], math_checker, ["4"] * 4)
    assert m["role/evaluator/verdict_accuracy"] == 0.75  # 3 of 4 verdicts right
    assert m["role/evaluator/verdict_balanced_accuracy"] == 0.5  # right answers: 3/3, wrong ones: 0/1
    # the hand-built batch of test_monitoring: right answers 2/4 judged right, wrong ones 1/2
    m = workflow_metrics(EvalOpt(max_iterations=3), eval_opt_batch(), [1.0, 0.0, 1.0], math_checker, ["4"] * 3)
    assert m["role/evaluator/verdict_accuracy"] == m["workflow/verdict_accuracy"] == 0.5
    assert m["role/evaluator/verdict_balanced_accuracy"] == 0.5


def test_balanced_accuracy_needs_both_kinds_of_answer():
    m = workflow_metrics(EvalOpt(), always_correct([r"\boxed{4}"] * 3), [1.0] * 3, math_checker, ["4"] * 3)
    assert m["role/evaluator/verdict_accuracy"] == 1.0 and "role/evaluator/verdict_balanced_accuracy" not in m
    assert "role/evaluator/verdict_accuracy" not in workflow_metrics(EvalOpt(), always_correct(["x"]), [0.0])


def judging(step: int, balanced: float | None, raw: float) -> dict[str, float]:
    log = normal_log(step) | {"role/evaluator/verdict_accuracy": raw}
    return log if balanced is None else log | {"role/evaluator/verdict_balanced_accuracy": balanced}


def kinds(callback: RoleDriftCallback) -> list[tuple[int, str, str]]:
    return [(a.step, a.role, a.kind) for a in callback.alarms]


def test_a_judge_drifting_to_the_base_rate_alarms(caplog):
    # Judges well for 4 logs, then says "Correct" ever more: raw accuracy stays ~0.85, balanced accuracy falls to 0.5
    balanced = [0.85, 0.8, 0.82, 0.8, 0.7, 0.55, 0.5, 0.5, 0.5]
    logs = [judging(step, b, 0.85) for step, b in enumerate(balanced, start=1)]
    callback = RoleDriftCallback()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.monitoring.drift"):
        state, _ = replay(callback, logs)
    # means of the last 3 logs: step 6: (0.8 + 0.7 + 0.55) / 3 = 0.683; step 7: 0.583 <= 0.6
    assert kinds(callback) == [(7, "evaluator", "judge_base_rate")]
    alarm = callback.alarms[0]
    assert alarm.metric == "role/evaluator/verdict_balanced_accuracy" and alarm.value == pytest.approx(1.75 / 3)
    assert state.log_history[6]["alarm/evaluator/judge_base_rate"] == 1.0
    assert "base rate" in caplog.text and 'set `role_rewards="balanced"`' in caplog.text


@pytest.mark.parametrize(
    "balanced, raw",
    [
        ([0.85, 0.8, 0.82, 0.8, 0.75, 0.8, 0.78, 0.8], 0.85),  # a judge that keeps judging
        ([0.85, 0.8, 0.82, 0.8, 0.5, 0.5, 0.5, 0.5], 0.55),  # at chance, and its raw accuracy shows it
        ([0.85, 0.8, 0.82, 0.8, None, None, None, None], 0.95),  # batches with one kind of answer: no evidence
        ([0.85, 0.8, 0.82, 0.8, 0.4, 0.8, 0.8, 0.8], 0.85),  # one noisy small batch is averaged away
    ],
    ids=["judging", "raw_accuracy_low", "one_kind_only", "one_noisy_batch"],
)
def test_the_alarm_stays_quiet(balanced, raw):
    callback = RoleDriftCallback(stop_on_alarm=True)
    replay(callback, [judging(step, b, raw) for step, b in enumerate(balanced, start=1)])
    assert callback.alarms == []


def test_a_judge_at_the_base_rate_from_its_start_is_not_watched(caplog):
    callback = RoleDriftCallback()
    with caplog.at_level(logging.INFO, logger="trl_multiagent.monitoring.drift"):
        replay(callback, [judging(step, 0.5, 0.9) for step in range(1, 10)])
    assert callback.alarms == [] and ("evaluator", "judge_base_rate") in callback.unwatched
    assert "starts at the base rate" in caplog.text


def test_the_thresholds_are_accuracies():
    with pytest.raises(ValueError, match="accuracy"):
        DriftThresholds(judge_balanced_accuracy=1.5)
    strict = RoleDriftCallback(DriftThresholds(judge_balanced_accuracy=0.75))
    replay(strict, [judging(step, b, 0.85) for step, b in enumerate([0.85, 0.8, 0.82, 0.75, 0.7, 0.7], start=1)])
    # step 5: (0.82 + 0.75 + 0.7) / 3 = 0.757 > 0.75; step 6: (0.75 + 0.7 + 0.7) / 3 = 0.717
    assert kinds(strict) == [(6, "evaluator", "judge_base_rate")]
