"""The end-of-training summary: the per-role table, the picture's panels and its trackers, from the log history."""

from __future__ import annotations

import json
import math

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from trl_multiagent.monitoring import TrainingSummaryCallback, judge_roles, plot_summary, summary_table
from trl_multiagent.monitoring.summary_plot import logged_alarms, logged_judges, running_mean, summary_panels
from trl_multiagent.workflows import BoxedAnswer, EvalOpt, OrchWorkers, Selection, Strategies, Verdict, Voting

NAN = float("nan")

HISTORY = [
    {
        "step": step,
        "loss": 0.1,
        "workflow/success": success,
        "workflow/samples_generated": 80,
        "workflow/verdict_accuracy": 0.5 + step / 100,
        "role/generator/completion_length": 10.0 + step,
        "role/evaluator/completion_length": 6.0,
        "role/evaluator/entropy": float("nan"),  # not finite: skipped
    }
    for step, success in zip(range(1, 7), [0.2, 0.4, 0.3, 0.5, 0.6, 0.8])
] + [{"step": 6, "train_runtime": 12.0, "train_loss": 0.1}]


def test_summary_table_reports_first_and_last_means_per_role():
    lines = summary_table(HISTORY, window=2).splitlines()
    assert lines[0] == "Training summary over 6 steps (mean of the first -> last 2 logged values)"
    # success first, then the other workflow metrics; bookkeeping counters are left out
    assert lines[1].split() == ["workflow/success", "0.3", "->", "0.7"]
    assert lines[2].split() == ["workflow/verdict_accuracy", "0.515", "->", "0.555"]
    assert not any("samples_generated" in line for line in lines)
    header = lines.index("") + 1
    assert lines[header].split() == ["role/<role>/...", "generator", "evaluator"]
    assert lines[header + 1].split() == ["completion_length", "11.5", "->", "15.5", "6", "->", "6"]
    assert not any(line.startswith("entropy") for line in lines)


def test_summary_table_without_workflow_metrics_says_so():
    assert summary_table([{"step": 1, "loss": 0.3}]) == "No workflow/... or role/<role>/... metrics were logged."


def _state(history, steps: int = 6) -> TrainerState:
    state = TrainerState(global_step=steps, max_steps=steps)
    state.log_history = history
    return state


def _args(tmp_path, report_to="none") -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), report_to=report_to, use_cpu=True)


def test_callback_saves_the_plot_and_the_log_history_next_to_the_checkpoints(tmp_path, capsys):
    TrainingSummaryCallback(window=2).on_train_end(_args(tmp_path), _state(HISTORY), TrainerControl())
    printed = capsys.readouterr().out
    assert "workflow/success" in printed and f"Saved {tmp_path / 'training_summary.png'}" in printed
    png = (tmp_path / "training_summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # the whole history, for `trl-multiagent report` (a checkpoint's may stop before the last step)
    saved = json.loads((tmp_path / "trainer_state.json").read_text())
    assert saved["global_step"] == 6 and len(saved["log_history"]) == len(HISTORY)


def test_plot_summary_without_metrics_writes_nothing(tmp_path):
    assert plot_summary([{"step": 1, "loss": 0.3}], str(tmp_path / "x.png")) is None
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------------------------------------ the picture
def test_judges_are_the_roles_whose_declared_format_is_a_verdict_or_a_selection():
    assert judge_roles(EvalOpt().formats) == {"evaluator": "verdict"}
    assert judge_roles(Voting().formats) == {"aggregator": "selection"}
    assert judge_roles(OrchWorkers().formats) == {}  # a plan and answers: nobody judges
    # Any names: a user's workflow is read by what it declares, formats or their kinds
    assert judge_roles({"critic": Verdict(), "writer": BoxedAnswer(), "picker": Selection(3)}) == {
        "critic": "verdict",
        "picker": "selection",
    }
    assert judge_roles({"planner": Strategies(2), "referee": "verdict"}) == {"referee": "verdict"}
    # Without the declarations, a log names its verdict roles by the accuracy only they log
    assert logged_judges([{"step": 1, "role/critic/verdict_accuracy": 0.5, "role/writer/entropy": 0.1}]) == {
        "critic": "verdict"
    }


def _run(steps: int = 40) -> list[dict]:
    """A two-role run: success rising; the writer's gradient share NaN on steps 5 and 9 (no gradient) and missing on
    step 7; the critic's balanced accuracy not logged on step 3; a drift alarm at steps 30 and 36."""
    history = []
    for step in range(1, steps + 1):
        entry = {
            "step": step,
            "workflow/success": 0.3 + 0.01 * step + (0.1 if step % 2 else -0.1),
            "role/writer/completion_length": 40.0 + step,
            "role/critic/completion_length": 12.0,
            "role/writer/entropy": 0.5 - 0.005 * step,
            "role/critic/entropy": 0.2,
            "role/writer/grad_norm_share": NAN if step in (5, 9) else 0.8,
            "role/critic/grad_norm_share": NAN if step in (5, 9) else 0.2 + 0.001 * step,
            "role/critic/verdict_accuracy": 0.7 + 0.002 * step,
            "role/critic/verdict_balanced_accuracy": 0.55 + 0.004 * step,
            "role/writer/truncated_fraction": 0.0,  # never cut: not drawn
            "role/critic/truncated_fraction": 0.0,
            "role/writer/clip_fraction": 0.0,  # one optimizer step per generation batch: nothing to clip
            "role/critic/clip_fraction": 0.0,
            "role/writer/kl": NAN,  # no finite value: not drawn
            "role/writer/unparseable": 0.05 if step == 20 else 0.0,  # one bad step: drawn
        }
        if step == 7:
            del entry["role/writer/grad_norm_share"]
        if step == 3:
            del entry["role/critic/verdict_balanced_accuracy"]
        if step in (30, 36):
            entry["alarm/critic/judge_base_rate"] = 1.0
        history.append(entry)
    return history + [{"step": steps, "train_runtime": 3.0}]


def test_the_picture_has_success_each_roles_length_entropy_and_gradient_share_and_each_judges_accuracy():
    panels, left_out = summary_panels(_run(), {"critic": "verdict"})
    assert [panel.title for panel in panels] == [
        "Success",
        "Completion length",
        "Entropy of the sampled tokens",
        "Share of the step's gradient norm",
        "Judge critic: verdicts right",
        "Outputs not in the declared format",
    ]
    by_title = {panel.title: panel for panel in panels}
    assert list(by_title["Completion length"].lines) == ["writer", "critic"]  # a line per role, constant ones too
    judge = by_title["Judge critic: verdicts right"]
    assert list(judge.lines) == ["verdict right", "balanced accuracy"] and judge.chance == 0.5
    assert [step for step, _ in judge.lines["balanced accuracy"]] == [s for s in range(1, 41) if s != 3]
    # Left out, each with why: constant by the settings (nothing cut, nothing clipped) or never finite
    assert left_out == [
        "outputs cut at the length cap: 0 at every step",
        "kl to the base model: no finite value",
        "tokens clipped by the ratio bound: 0 at every step",
    ]


def test_steps_without_a_value_are_skipped_never_drawn_as_zero():
    panels, _ = summary_panels(_run(), {"critic": "verdict"})
    share = next(panel for panel in panels if panel.title == "Share of the step's gradient norm")
    writer_steps = [step for step, _ in share.lines["writer"]]
    assert writer_steps == [s for s in range(1, 41) if s not in (5, 7, 9)]  # NaN on 5 and 9, missing on 7
    assert all(math.isfinite(value) for line in share.lines.values() for _, value in line)


def test_a_flat_success_is_drawn_and_a_run_without_judges_has_no_judge_panel():
    history = [{"step": s, "workflow/success": 0.0, "role/solver/completion_length": 9.0 + s} for s in range(1, 6)]
    panels, left_out = summary_panels(history, judges={})
    assert [panel.title for panel in panels] == ["Success", "Completion length"] and left_out == []


def test_judges_found_in_the_log_when_the_declarations_are_not_given():
    panels, _ = summary_panels(_run())
    assert "Judge critic: verdicts right" in [panel.title for panel in panels]


def test_alarms_are_read_with_their_steps_and_the_picture_names_them(tmp_path):
    alarms = logged_alarms(_run())
    assert [(a.step, a.role, a.kind) for a in alarms] == [
        (30, "critic", "judge_base_rate"),
        (36, "critic", "judge_base_rate"),
    ]
    from matplotlib.image import imread

    path = plot_summary(_run(), str(tmp_path / "summary.png"), judges={"critic": "verdict"})
    height, width, _ = imread(path).shape
    assert width == 1300 and 700 < height < 900  # two rows of three panels, 13 in wide at 100 dpi


def test_running_mean_is_centred_and_keeps_the_ends():
    assert running_mean([0.0, 3.0, 6.0, 9.0], 3) == [1.5, 3.0, 6.0, 7.5]
    assert running_mean([1.0, 2.0], 1) == [1.0, 2.0]


def test_the_picture_goes_to_the_runs_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args, state, control = _args(tmp_path, report_to=["tensorboard"]), _state(_run(), steps=40), TrainerControl()
    tensorboard = TensorBoardCallback()
    summary = TrainingSummaryCallback(judges={"critic": "verdict"}, trackers=[tensorboard])
    tensorboard.on_train_begin(args, state, control)
    tensorboard.on_log(args, state, control, logs={"workflow/success": 0.5})
    for callback in (tensorboard, summary):  # the Trainer's order: report_to integrations first
        callback.on_train_end(args, state, control)

    events = EventAccumulator(tensorboard.logging_dir, size_guidance={"images": 0})
    events.Reload()
    assert "training_summary" in events.Tags()["images"]
    (image,) = events.Images("training_summary")
    assert image.step == 40 and image.width == 1300 and image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
