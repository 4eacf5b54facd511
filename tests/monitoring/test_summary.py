"""The end-of-training summary: the per-role table and the PNG are built from the trainer's log history."""

from __future__ import annotations

from types import SimpleNamespace

from trl_multiagent.monitoring import TrainingSummaryCallback, plot_summary, summary_table

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


def test_callback_saves_the_plot_next_to_the_checkpoints(tmp_path, capsys):
    state = SimpleNamespace(log_history=HISTORY, is_world_process_zero=True)
    TrainingSummaryCallback(window=2).on_train_end(SimpleNamespace(output_dir=str(tmp_path)), state, None)
    printed = capsys.readouterr().out
    assert "workflow/success" in printed and f"Saved {tmp_path / 'training_summary.png'}" in printed
    png = (tmp_path / "training_summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_plot_summary_without_metrics_writes_nothing(tmp_path):
    assert plot_summary([{"step": 1, "loss": 0.3}], str(tmp_path / "x.png")) is None
    assert not (tmp_path / "x.png").exists()
