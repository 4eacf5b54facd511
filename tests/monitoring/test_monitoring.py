r"""Monitoring: workflow metrics on hand-built episodes, and drift alarms on scripted log sequences. No model.

Every expected value is worked out by hand in the comment next to it.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from pathlib import Path

import pytest
from transformers import TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler

from trl_multiagent.monitoring import DriftAlarm, DriftThresholds, RoleDriftCallback, workflow_metrics
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.tasks.math import math_reward
from trl_multiagent.workflows import (
    BoxedAnswer,
    EvalOpt,
    Messages,
    OrchWorkers,
    Selection,
    SingleAgent,
    Verdict,
    Voting,
    Workflow,
)

CODE = "```python\nprint(4)\n```"


def call(role: str, text: str, instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [], [1, 2], [3] * len(text.split()), text, truncated=False)


def math_checker(text: str, answer: str) -> bool:
    return math_reward([text], [answer])[0] == 1.0


def contains_checker(text: str, answer: str) -> bool:
    return f"\\boxed{{{answer}}}" in text


# ------------------------------------------------------------------------------------------------ workflow metrics
def voting_batch() -> tuple[list[Episode], list[float], list[str]]:
    # Episode 0, answer 4: voters answer 4, 5, 4 (reported out of order; instance decides), aggregator picks 2 -> 5.
    first = Episode(
        0,
        [
            call("generator", r"so \boxed{5}", instance=1),
            call("generator", r"so \boxed{4}", instance=0),
            call("generator", r"hence \boxed{4}", instance=2),
            call("aggregator", r"Solution 2 checks out. \boxed{2}"),
        ],
    )
    # Episode 1, answer 7: voters 7, 8, no box; the aggregator gives no box, parse_selection falls back to digit 1.
    second = Episode(
        1,
        [
            call("generator", r"\boxed{7}", instance=0),
            call("generator", r"\boxed{8}", instance=1),
            call("generator", "seven I think", instance=2),
            call("aggregator", "Solution 1 is right."),
        ],
    )
    return [first, second], [0.0, 1.0], ["4", "7"]


def test_voting_metrics():
    episodes, rewards, answers = voting_batch()
    m = workflow_metrics(Voting(n_voters=3), episodes, rewards, math_checker, answers)

    assert m["workflow/success"] == 0.5
    assert m["workflow/selection/1"] == 0.5  # episode 1 (fallback pick)
    assert m["workflow/selection/2"] == 0.5  # episode 0 picked \boxed{2}
    assert m["workflow/selection/3"] == 0.0
    assert m["role/generator/unparseable"] == pytest.approx(1 / 6)  # "seven I think"
    assert m["role/aggregator/unparseable"] == 0.5  # episode 1's pick was a fallback
    assert m["workflow/regraded/generator"] == 0.5  # right: 4, 4 | 7 -> 3 of 6
    assert m["workflow/any_correct"] == 1.0
    assert m["workflow/pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    # pass@2: episode 0 (n=3, c=2) = 1; episode 1 (c=1) = 1 - C(2,2)/C(3,2) = 2/3.
    assert m["workflow/pass@2"] == pytest.approx((1 + 2 / 3) / 2)
    assert m["workflow/pass@3"] == m["workflow/any_correct"]
    assert m["workflow/selection_accuracy"] == 0.5  # episode 0 picked the wrong 5, episode 1 the right 7
    # Words per voter output: 2, 2, 2, 1, 1, 3 -> sorted 1 1 2 2 2 3: median 2, p95 (6th of 6) 3.
    assert m["role/generator/words_median"] == 2.0
    assert m["role/generator/words_p95"] == 3.0
    assert m["role/aggregator/words_median"] == 4.5  # 5 and 4 words
    assert m["role/aggregator/code_block_fraction"] == 0.0


def test_voting_matches_the_brief_example():
    """Voters answer 4, 5, 4 against 4; the aggregator picks \\boxed{2}."""
    episodes, _, _ = voting_batch()
    m = workflow_metrics(Voting(), episodes[:1], [0.0], contains_checker, ["4"])
    assert m["workflow/selection/2"] == 1.0
    assert m["workflow/regraded/generator"] == pytest.approx(2 / 3)
    assert m["workflow/any_correct"] == 1.0
    assert m["workflow/selection_accuracy"] == 0.0


def eval_opt_batch() -> list[Episode]:
    return [
        # Rejected 5, accepted 4: two iterations, both verdicts right.
        Episode(
            0,
            [
                call("generator", r"\boxed{5}"),
                call("evaluator", r"Step 2 is wrong. \boxed{Incorrect}"),
                call("generator", r"\boxed{4}"),
                call("evaluator", r"\boxed{Correct}"),
            ],
        ),
        # Right 4 (no verdict: code instead), right 4 (rejected), no box (accepted): all three verdicts wrong.
        Episode(
            1,
            [
                call("generator", r"\boxed{4}"),
                call("evaluator", f"Let me recompute.\n{CODE}"),
                call("generator", r"\boxed{4}"),
                call("evaluator", r"\boxed{Incorrect}"),
                call("generator", "It is four."),
                call("evaluator", r"\boxed{Correct}"),
            ],
        ),
        # Right first time, accepted.
        Episode(2, [call("generator", r"\boxed{4}"), call("evaluator", r"\boxed{Correct}")]),
    ]


def test_eval_opt_metrics():
    m = workflow_metrics(EvalOpt(max_iterations=3), eval_opt_batch(), [1.0, 0.0, 1.0], math_checker, ["4"] * 3)

    assert m["workflow/success"] == pytest.approx(2 / 3)
    assert m["workflow/iterations"] == 2.0  # (2 + 3 + 1) / 3
    assert m["workflow/retry_rate"] == pytest.approx(2 / 3)  # episodes 0 and 1 retried
    # Six verdicts: Correct x3, Incorrect x2, none x1.
    assert m["workflow/verdict_correct_rate"] == 0.5
    assert m["workflow/verdict_incorrect_rate"] == pytest.approx(1 / 3)
    assert m["workflow/verdict_unparseable_rate"] == pytest.approx(1 / 6)
    assert m["role/evaluator/unparseable"] == pytest.approx(1 / 6)
    assert m["workflow/verdict_accuracy"] == 0.5  # 2 right in episode 0, 0 in episode 1, 1 in episode 2
    assert m["workflow/regraded/generator"] == pytest.approx(4 / 6)  # 5 x, 4 v | 4 v, 4 v, none x | 4 v
    assert m["role/generator/unparseable"] == pytest.approx(1 / 6)
    assert m["role/evaluator/code_block_fraction"] == pytest.approx(1 / 6)
    assert "workflow/any_correct" not in m  # sequential attempts are not independent samples


def test_eval_opt_without_ground_truth_keeps_behaviour_metrics():
    m = workflow_metrics(EvalOpt(), eval_opt_batch(), [1.0, 0.0, 1.0])
    assert m["workflow/retry_rate"] == pytest.approx(2 / 3)
    assert not any(key.startswith("workflow/regraded") or key == "workflow/verdict_accuracy" for key in m)


def test_orch_workers_metrics():
    episodes = [
        # Answer 4: two strategies for three workers; workers 4, 4, no box; synthesizer 4.
        Episode(
            0,
            [
                call("orchestrator", "STRATEGY 1: algebra\nSTRATEGY 2: casework"),
                call("worker", r"\boxed{4}", instance=2),
                call("worker", r"\boxed{4}", instance=0),
                call("worker", "no idea", instance=1),
                call("synthesizer", r"Both agree: \boxed{4}"),
            ],
        ),
        # Answer 4: three strategies; every worker and the synthesizer say 3.
        Episode(
            1,
            [
                call("orchestrator", "STRATEGY 1: a\nSTRATEGY 2: b\n**Strategy 3:** c"),
                *(call("worker", r"\boxed{3}", instance=i) for i in range(3)),
                call("synthesizer", r"\boxed{3}"),
            ],
        ),
    ]
    m = workflow_metrics(OrchWorkers(workers="fixed"), episodes, [1.0, 0.0], contains_checker, ["4", "4"])

    assert m["role/orchestrator/unparseable"] == 0.5  # fixed worker count: episode 0 lacked a third strategy
    assert m["role/worker/unparseable"] == pytest.approx(1 / 6)
    assert m["role/synthesizer/unparseable"] == 0.0
    assert m["workflow/regraded/worker"] == pytest.approx(2 / 6)
    assert m["workflow/regraded/synthesizer"] == 0.5
    assert m["workflow/any_correct"] == 0.5
    assert m["workflow/pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert m["workflow/pass@2"] == 0.5  # episode 0: 1 - C(1,2)/C(3,2) = 1
    assert m["workflow/pass@3"] == 0.5
    assert m["role/synthesizer/words_median"] == 2.0  # 3 and 1 words
    assert m["workflow/plan_size"] == 2.5  # 2 and 3 strategies
    # One worker per strategy: two headers are a readable plan.
    per_strategy = workflow_metrics(OrchWorkers(), episodes, [1.0, 0.0], contains_checker, ["4", "4"])
    assert per_strategy["role/orchestrator/unparseable"] == 0.0


def test_orch_workers_metrics_with_a_variable_worker_count():
    episodes = [
        # Two strategies, two workers (4 right, 5 wrong); one strategy, one worker (4 right); no header (fallback).
        Episode(
            0,
            [
                call("orchestrator", "STRATEGY 1: a\nSTRATEGY 2: b"),
                call("worker", r"\boxed{4}"),
                call("worker", r"\boxed{5}", instance=1),
                call("synthesizer", r"\boxed{4}"),
            ],
        ),
        Episode(1, [call("orchestrator", "STRATEGY 1: a"), call("worker", r"\boxed{4}"), call("synthesizer", "4")]),
        Episode(
            2,
            [
                call("orchestrator", "1. guess\n2. check"),
                call("worker", r"\boxed{3}"),
                call("worker", r"\boxed{3}", instance=1),
                call("synthesizer", r"\boxed{3}"),
            ],
        ),
    ]
    m = workflow_metrics(OrchWorkers(), episodes, [1.0, 0.0, 0.0], contains_checker, ["4"] * 3)
    assert m["role/orchestrator/unparseable"] == pytest.approx(1 / 3)  # the numbered list is a fallback
    assert m["workflow/plan_size"] == pytest.approx(5 / 3)  # 2, 1, 2 strategies read
    assert m["workflow/regraded/worker"] == pytest.approx(2 / 5)
    assert m["workflow/any_correct"] == pytest.approx(2 / 3)
    assert m["workflow/pass@1"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert m["workflow/pass@2"] == pytest.approx((1 + 0) / 2)  # episode 1 has one worker: no pass@2
    assert m["role/synthesizer/unparseable"] == pytest.approx(1 / 3)


def test_code_task_needs_a_python_block():
    episodes = [
        Episode(
            0,
            [
                call("orchestrator", "STRATEGY 1: a STRATEGY 2: b STRATEGY 3: c"),
                call("worker", CODE, instance=0),
                call("worker", "```\nprint(4)\n```", instance=1),  # untagged: the code reward runs it, so it counts
                call("worker", r"\boxed{4}", instance=2),
                call("synthesizer", CODE),
            ],
        )
    ]
    m = workflow_metrics(OrchWorkers(task="code"), episodes, [1.0])
    assert m["role/worker/unparseable"] == pytest.approx(1 / 3)
    assert m["role/synthesizer/unparseable"] == 0.0
    assert m["role/orchestrator/unparseable"] == 0.0  # headers on one line still split
    assert m["role/worker/code_block_fraction"] == pytest.approx(2 / 3)  # any fenced block counts as style


@pytest.mark.parametrize("template", ["generator", "raw"])
def test_single_agent_reads_its_tasks_answer_format(template):
    episodes = [Episode(0, [call("generator", r"\boxed{4}")]), Episode(1, [call("generator", CODE)])]
    episodes.append(Episode(2, [call("generator", "four")]))
    m = workflow_metrics(SingleAgent(template=template), episodes, [1.0, 0.0, 0.0], contains_checker, ["4"] * 3)
    assert m["role/generator/unparseable"] == pytest.approx(2 / 3)  # math: the code block is no answer
    assert m["workflow/regraded/generator"] == pytest.approx(1 / 3)
    code = workflow_metrics(SingleAgent(task="code", template=template), episodes, [1.0, 0.0, 0.0])
    assert code["role/generator/unparseable"] == pytest.approx(2 / 3)


class PlanSolve(Workflow):
    roles = ("planner", "solver")

    async def run(self, prompt: Messages, generate) -> str:
        return await generate("solver", prompt)


def test_user_workflow_gets_generic_role_features_only():
    episodes = [Episode(0, [call("planner", "plan: add"), call("solver", r"\boxed{4}")])]
    m = workflow_metrics(PlanSolve(), episodes, [1.0], contains_checker, ["4"])
    assert set(m) == {"workflow/success"} | {
        f"role/{role}/{feature}"
        for role in ("planner", "solver")
        for feature in ("code_block_fraction", "words_median", "words_p95")
    }


class DraftJudgePick(Workflow):
    """Two drafters, a checker judging the last draft, a chooser picking one: declared, not built in."""

    roles = ("drafter", "checker", "chooser")
    formats = {"drafter": BoxedAnswer(), "checker": Verdict(), "chooser": Selection(2)}

    async def run(self, prompt: Messages, generate) -> str:
        raise NotImplementedError  # only its declarations are read here


def test_user_workflow_gets_the_metrics_of_its_declared_formats():
    episodes = [
        Episode(
            0,
            [
                call("drafter", r"\boxed{4}"),
                call("drafter", r"\boxed{5}", instance=1),
                call("checker", r"\boxed{Incorrect}"),  # judges the last draft (5): right
                call("chooser", r"\boxed{1}"),  # picks 4: right
            ],
        )
    ]
    m = workflow_metrics(DraftJudgePick(), episodes, [1.0], contains_checker, ["4"])
    assert m["role/drafter/unparseable"] == 0.0 and m["role/checker/unparseable"] == 0.0
    assert m["workflow/regraded/drafter"] == 0.5
    assert m["workflow/any_correct"] == 1.0 and m["workflow/pass@2"] == 1.0
    assert m["workflow/verdict_accuracy"] == 1.0 and m["workflow/verdict_incorrect_rate"] == 1.0
    assert m["workflow/selection/1"] == 1.0 and m["workflow/selection_accuracy"] == 1.0


def test_monitoring_reads_declarations_not_workflow_classes():
    source = Path(inspect.getsourcefile(workflow_metrics)).read_text()
    for name in ("EvalOpt", "Voting", "OrchWorkers", "SingleAgent", "isinstance"):
        assert name not in source


def test_word_percentiles_are_nearest_rank():
    episodes = [Episode(i, [call("generator", " ".join(["w"] * (i + 1)))]) for i in range(20)]  # 1 .. 20 words
    m = workflow_metrics(SingleAgent(), episodes, [0.0] * 20)
    assert m["role/generator/words_median"] == 10.5
    assert m["role/generator/words_p95"] == 19.0  # the ceil(0.95 * 20) = 19th smallest


def test_unscorable_rewards_are_left_out_of_success():
    episodes = [Episode(i, [call("generator", r"\boxed{1}")]) for i in range(3)]
    assert workflow_metrics(SingleAgent(), episodes, [1.0, math.nan, 0.0])["workflow/success"] == 0.5
    assert "workflow/success" not in workflow_metrics(SingleAgent(), episodes, [math.nan] * 3)
    assert workflow_metrics(SingleAgent(), [], []) == {}


def test_mismatched_inputs_fail_early():
    episodes, rewards, answers = voting_batch()
    with pytest.raises(ValueError, match="2 episodes"):
        workflow_metrics(Voting(), episodes, rewards[:1])
    with pytest.raises(ValueError, match="both"):
        workflow_metrics(Voting(), episodes, rewards, answer_checker=math_checker)
    with pytest.raises(ValueError, match="one ground truth"):
        workflow_metrics(Voting(), episodes, rewards, math_checker, answers[:1])


# -------------------------------------------------------------------------------------------------- drift alarms
EVAL_OPT_FORMATS = EvalOpt().formats  # the judges and solvers of the Eval-Opt logs below, as the trainer passes them


def normal_log(step: int) -> dict[str, float]:
    """An Eval-Opt run that behaves: lengths, styles and perplexities wobble a little, success climbs."""
    wobble = 1 + 0.1 * ((-1) ** step)
    return {
        "loss": 0.01,
        "workflow/success": 0.3 + 0.02 * step,
        "role/generator/completion_length": 400 * wobble,
        "role/generator/words_median": 300 * wobble,
        "role/generator/truncated_fraction": 0.01,
        "role/generator/perplexity": 1.3 * wobble,
        "role/generator/entropy": 0.4 * wobble,
        "role/generator/code_block_fraction": 0.0,
        "role/evaluator/completion_length": 150 * wobble,
        "role/evaluator/words_median": 120 * wobble,
        "role/evaluator/truncated_fraction": 0.0,
        "role/evaluator/perplexity": 1.2 * wobble,
        "role/evaluator/code_block_fraction": 0.1,
    }


def replay(callback: RoleDriftCallback, logs: list[dict[str, float]]) -> tuple[TrainerState, TrainerControl]:
    """Feed the logs to ``on_log`` as Trainer.log does: one per step, after storing a copy in log_history."""
    state, control = TrainerState(), TrainerControl()
    for step, entry in enumerate(logs, start=1):
        state.global_step = step
        state.log_history.append({**entry, "step": step})
        control = callback.on_log(None, state, control, logs=entry)
    return state, control


def with_changes(step: int, **changes: float) -> dict[str, float]:
    return normal_log(step) | {key.replace("__", "/"): value for key, value in changes.items()}


def only(alarms: list[DriftAlarm]) -> DriftAlarm:
    assert len(alarms) == 1, alarms
    return alarms[0]


def test_normal_run_stays_quiet():
    callback = RoleDriftCallback(formats=EVAL_OPT_FORMATS, stop_on_alarm=True)
    state, control = replay(callback, [normal_log(step) for step in range(1, 31)])
    assert callback.alarms == []
    assert not control.should_training_stop
    assert not any(key.startswith("alarm/") for entry in state.log_history for key in entry)


def test_judge_writing_code_alarms_once_until_it_clears(caplog):
    logs = [normal_log(step) for step in range(1, 5)]
    logs += [with_changes(5, role__evaluator__code_block_fraction=0.7)]
    logs += [with_changes(6, role__evaluator__code_block_fraction=0.99)]  # still on: no repeat
    logs += [normal_log(7), with_changes(8, role__evaluator__code_block_fraction=0.8)]  # cleared, then again
    callback = RoleDriftCallback(formats=EVAL_OPT_FORMATS)
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.monitoring.drift"):
        state, _ = replay(callback, logs)

    assert [(a.step, a.role, a.kind) for a in callback.alarms] == [
        (5, "evaluator", "judge_code"),
        (8, "evaluator", "judge_code"),
    ]
    alarm = callback.alarms[0]
    assert (alarm.metric, alarm.value, alarm.threshold) == ("role/evaluator/code_block_fraction", 0.7, 0.5)
    assert logs[4]["alarm/evaluator/judge_code"] == 1.0  # in the logs the report_to callbacks read
    assert state.log_history[4]["alarm/evaluator/judge_code"] == 1.0  # and in trainer_state.json
    assert "alarm/evaluator/judge_code" not in logs[5]
    assert (
        "step 5" in caplog.text
        and "'evaluator'" in caplog.text
        and "role/evaluator/code_block_fraction" in caplog.text
    )


def test_judge_growing_to_solver_length_alarms():
    # Aggregator 200 words next to voters at 600: fine. At 500 words it is past 0.75 x 600 = 450, yet under 3x its
    # own baseline (600), so only judge_length fires: the SP Voting 4B signature, invisible in voter metrics.
    def voting_log(aggregator_words: float) -> dict[str, float]:
        return {"role/generator/words_median": 600.0, "role/aggregator/words_median": aggregator_words}

    callback = RoleDriftCallback(formats=Voting().formats)
    replay(callback, [voting_log(200.0)] * 4 + [voting_log(500.0)])
    alarm = only(callback.alarms)
    assert (alarm.step, alarm.role, alarm.kind) == (5, "aggregator", "judge_length")
    assert (alarm.metric, alarm.value) == ("role/aggregator/words_median", 500.0)
    assert alarm.threshold == pytest.approx(450.0)


def test_synthesizer_collapse_alarms_on_median_and_cap():
    # Orch-Workers: synthesizer median 369 -> 19 words while its p95 hits the cap (20% of outputs truncated).
    def orch_log(words: float, truncated: float) -> dict[str, float]:
        return {
            "workflow/success": 0.4,
            "role/worker/words_median": 500.0,
            "role/synthesizer/words_median": words,
            "role/synthesizer/truncated_fraction": truncated,
        }

    callback = RoleDriftCallback()
    replay(callback, [orch_log(369.0, 0.0)] * 3 + [orch_log(300.0, 0.02), orch_log(19.0, 0.2)])
    by_kind = {alarm.kind: alarm for alarm in callback.alarms}
    assert set(by_kind) == {"length_drift", "length_cap"}
    drift, cap = by_kind["length_drift"], by_kind["length_cap"]
    assert (drift.step, drift.role, drift.metric, drift.value) == (
        5,
        "synthesizer",
        "role/synthesizer/words_median",
        19,
    )
    assert drift.threshold == pytest.approx(369.0 / 3)  # the lower bound of a downward drift
    assert (cap.step, cap.role, cap.metric, cap.threshold) == (
        5,
        "synthesizer",
        "role/synthesizer/truncated_fraction",
        0.05,
    )
    assert cap.value == pytest.approx((0.0 + 0.02 + 0.2) / 3)  # a tail rate: the mean of the last three logs


def test_length_growth_alarms_against_the_early_baseline():
    # Evaluator re-solving (the math Eval-Opt signature): 131 -> 986 words median. The baseline is the mean of the
    # first three logs (120 x 0.9, 1.1, 0.9 = 124 words), so the bound is 372; the generator's median is 300 x
    # 0.9 = 270, so 986 words is solver-length too.
    logs = [normal_log(step) for step in range(1, 6)] + [with_changes(6, role__evaluator__words_median=986.0)]
    callback = RoleDriftCallback(formats=EVAL_OPT_FORMATS)
    replay(callback, logs)
    kinds = {alarm.kind: alarm for alarm in callback.alarms}
    assert set(kinds) == {"length_drift", "judge_length"}
    assert kinds["length_drift"].threshold == pytest.approx(3 * 120 * (0.9 + 1.1 + 0.9) / 3)
    assert all(alarm.role == "evaluator" and alarm.step == 6 for alarm in callback.alarms)


def test_perplexity_rise_before_accuracy_falls_alarms():
    # Generator perplexity baseline (1.3 x 0.9, 1.1, 0.9) = 1.2567; 2.0 is past 1.5x with success still climbing.
    logs = [normal_log(step) for step in range(1, 8)] + [with_changes(8, role__generator__perplexity=2.0)]
    callback = RoleDriftCallback()
    replay(callback, logs)
    alarm = only(callback.alarms)
    assert (alarm.step, alarm.role, alarm.kind, alarm.metric) == (
        8,
        "generator",
        "perplexity_rise",
        "role/generator/perplexity",
    )
    assert alarm.threshold == pytest.approx(1.5 * 1.3 * (0.9 + 1.1 + 0.9) / 3)


def test_entropy_rise_after_accuracy_fell_is_not_an_early_warning():
    # Success baseline (0.32 + 0.34 + 0.36) / 3 = 0.34; at 0.2 it has fallen past the 0.05 tolerance.
    fallen = [with_changes(8, role__generator__entropy=1.0, workflow__success=0.2)]
    callback = RoleDriftCallback()
    replay(callback, [normal_log(step) for step in range(1, 8)] + fallen)
    assert callback.alarms == []

    holding = [with_changes(8, role__generator__entropy=1.0, workflow__success=0.31)]
    callback = RoleDriftCallback()
    replay(callback, [normal_log(step) for step in range(1, 8)] + holding)
    assert [(a.step, a.role, a.kind) for a in callback.alarms] == [(8, "generator", "entropy_rise")]


def test_stop_on_alarm_stops_training():
    logs = [normal_log(step) for step in range(1, 4)] + [with_changes(4, role__generator__truncated_fraction=0.3)]
    _, control = replay(RoleDriftCallback(stop_on_alarm=True), logs)
    assert control.should_training_stop
    _, control = replay(RoleDriftCallback(), logs)
    assert not control.should_training_stop


def test_eval_logs_and_missing_metrics_do_not_alarm_or_clear():
    callback = RoleDriftCallback()
    logs = [normal_log(step) for step in range(1, 4)]
    logs += [with_changes(4, role__generator__truncated_fraction=0.3)]
    logs += [{"eval_role/generator/truncated_fraction": 0.0, "eval_loss": 1.0}]  # an eval log: not a train metric
    logs += [with_changes(6, role__generator__truncated_fraction=0.3)]  # still on: no second alarm
    replay(callback, logs)
    assert [(a.step, a.kind) for a in callback.alarms] == [(4, "length_cap")]


def test_alarm_keys_reach_reporting_callbacks_placed_after_it():
    class Recorder(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.seen.append(dict(logs))

    recorder = Recorder()
    handler = CallbackHandler([recorder], None, None, None, None)
    handler.callbacks.insert(
        0, RoleDriftCallback(formats=EVAL_OPT_FORMATS)
    )  # as documented: ahead of the report_to integrations
    state, control = TrainerState(), TrainerControl()
    for step, entry in enumerate([normal_log(1)] * 3 + [with_changes(4, role__evaluator__code_block_fraction=0.9)]):
        state.global_step = step + 1
        handler.on_log(None, state, control, entry)
    assert recorder.seen[-1]["alarm/evaluator/judge_code"] == 1.0


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"judge_code_fraction": 1.5}, "fraction"),
        ({"length_drift_factor": 1.0}, "factor > 1"),
        ({"baseline_steps": 0}, "baseline_steps"),
        ({"success_tolerance": -0.1}, "success_tolerance"),
    ],
)
def test_thresholds_are_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        DriftThresholds(**bad)


# Drift-relevant metrics of the toy presets' own runs (scripts/toy_preset_logs.py): what a user's first run logs.
PRESET_LOGS = json.loads((Path(__file__).parents[1] / "fixtures" / "toy_preset_logs.json").read_text())["runs"]


PRESET_FORMATS = {
    "eval_opt": EvalOpt().formats,
    "single_agent": SingleAgent().formats,
    "orch_workers": OrchWorkers().formats,
    "voting": Voting().formats,
}


@pytest.mark.parametrize("preset", sorted(PRESET_LOGS))
def test_toy_preset_runs_raise_no_alarm(preset):
    callback = RoleDriftCallback(formats=PRESET_FORMATS[preset])
    replay(callback, PRESET_LOGS[preset])
    assert callback.alarms == []


def test_a_judge_past_a_signature_from_its_start_is_not_drift_but_real_drift_still_fires(caplog):
    # The toy evaluator cites every line it judges: about the generator's length from step 1 (the false judge_length
    # alarm a fixed threshold raised at step 1 of the README's first command).
    logs = PRESET_LOGS["eval_opt"]
    callback = RoleDriftCallback(formats=EVAL_OPT_FORMATS)
    with caplog.at_level(logging.INFO, logger="trl_multiagent.monitoring.drift"):
        replay(callback, logs)
    assert callback.alarms == [] and ("evaluator", "judge_length") in callback.unwatched
    assert "Role 'evaluator' starts past the judge_length threshold" in caplog.text
    # The same run with a captured evaluator at step 12 (code blocks, 5x its starting length) still alarms.
    start = sum(log["role/evaluator/words_median"] for log in logs[:3]) / 3
    captured = {**logs[11], "role/evaluator/code_block_fraction": 0.9, "role/evaluator/words_median": 5 * start}
    callback = RoleDriftCallback(formats=EVAL_OPT_FORMATS)
    replay(callback, [*logs[:11], captured])
    assert {(a.step, a.role, a.kind) for a in callback.alarms} == {
        (12, "evaluator", "judge_code"),
        (12, "evaluator", "length_drift"),
    }


def test_no_alarm_before_a_role_has_its_starting_window():
    capped = {**normal_log(1), "role/generator/truncated_fraction": 0.5, "role/evaluator/code_block_fraction": 0.9}
    callback = RoleDriftCallback(formats=EVAL_OPT_FORMATS)
    replay(callback, [capped])
    assert callback.alarms == []


def test_a_near_deterministic_roles_entropy_wobble_is_not_a_rise():
    # The README's first command, all 100 steps, on the toy model before its rebuild: the evaluator's entropy goes
    # 0.037 -> 0.06-0.07 nats per token from step 71 (1.7x, a small batch's sampling noise at that level). Only the
    # absolute floor keeps it quiet.
    logs = json.loads((Path(__file__).parents[1] / "fixtures" / "evaluator_entropy_wobble.json").read_text())["log"]
    noisy = RoleDriftCallback(DriftThresholds(entropy_min_rise=0.0))
    replay(noisy, logs)
    assert [(a.step, a.role, a.kind) for a in noisy.alarms][:1] == [(71, "evaluator", "entropy_rise")]
    quiet = RoleDriftCallback()
    replay(quiet, logs)
    assert quiet.alarms == []
