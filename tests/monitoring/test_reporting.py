"""Per-role and workflow metrics reach the report_to backends, the completions table and the drift alarms."""

from __future__ import annotations

import glob
import time
from pathlib import Path

import pandas as pd
import pytest
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer


def voting_run(tiny_model_dir, tmp_path, respond=random_answers, answer_checker=None, **overrides):
    settings = dict(
        per_device_train_batch_size=8,
        max_completion_length=16,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        save_strategy="no",
        policy_sharing="isolated",
        seed=0,
    )
    settings.update(overrides)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path / "run",
        dataset=addition_dataset(4),
        respond=respond,
        answer_checker=answer_checker,
        **settings,
    )
    trainer.train()
    return trainer


def test_workflow_metrics_with_ground_truth(tiny_model_dir, tmp_path):
    trainer = voting_run(tiny_model_dir, tmp_path, answer_checker=lambda text, answer: f"{{{answer}}}" in text)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for key in ("workflow/regraded/generator", "workflow/any_correct", "workflow/pass@1", "workflow/selection/1"):
        assert 0.0 <= logs[0][key] <= 1.0, key
    assert logs[0]["role/generator/unparseable"] == 0.0  # every scripted voter output has a \boxed{}


def test_judge_turning_to_code_raises_an_alarm(tiny_model_dir, tmp_path):
    aggregator_batches = []

    def aggregator_turns_to_code(requests, rng):
        # The aggregator judges normally in its starting window (step 1), then writes code (step 2).
        is_aggregator = ["Solution 1" in r.messages[-1]["content"] for r in requests]
        aggregator_batches.append(any(is_aggregator))
        code = sum(aggregator_batches) > 1
        return ["```python\nprint(1)\n```" if code and a else "\\boxed{4}" for a in is_aggregator]

    trainer = voting_run(
        tiny_model_dir, tmp_path, respond=aggregator_turns_to_code, drift_thresholds={"baseline_steps": 1}
    )
    alarms = [h for h in trainer.state.log_history if "alarm/aggregator/judge_code" in h]
    assert alarms and alarms[0]["step"] == 2
    assert all("alarm/generator/judge_code" not in h for h in trainer.state.log_history)


def test_completions_table_has_a_column_per_role(tiny_model_dir, tmp_path):
    voting_run(tiny_model_dir, tmp_path, log_completions=True)
    table = pd.read_parquet(sorted(glob.glob(str(tmp_path / "run" / "completions" / "*.parquet")))[-1])
    assert {"role/generator", "role/aggregator"} <= set(table.columns)
    assert table["role/generator"].str.count("---").eq(2).all()  # three voters per episode


@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_report_to_backends_receive_role_series(tiny_model_dir, tmp_path, monkeypatch, backend):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    voting_run(tiny_model_dir, tmp_path, report_to=backend)
    if backend == "wandb":
        import wandb

        wandb.finish()  # flush the offline run, as the end of a script does
        files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))
    else:
        files = glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, f"no {backend} files written"
    keys = (b"role/generator/entropy", b"role/aggregator/perplexity", b"workflow/samples_trained")
    deadline = time.monotonic() + 60  # the wandb service may still be writing its file after finish() returns
    while True:
        data = b"".join(open(f, "rb").read() for f in files)
        missing = [key for key in keys if key not in data]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, missing
    if backend == "tensorboard":  # the summary picture too, once training ended
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(Path(files[0]).parent), size_guidance={"images": 0})
        events.Reload()
        (image,) = events.Images("training_summary")
        assert image.step == 2 and image.width == 1300
