"""Nothing lost when a save fails: a checkpoint under its final name is always complete. A save that fails midway
(a full disk) or is killed midway (SIGKILL, as a preempted job) leaves the previous checkpoint loadable, and
``resume_from_checkpoint=True`` resumes from the newest complete one, naming what it skipped."""

from __future__ import annotations

import errno
import json
import logging
import sys

import pytest
from harness import TESTS, run_offline
from tiny import half_right_answers, tiny_trainer

import trl_multiagent.checkpoints.role_adapters as role_adapters
from trl_multiagent.checkpoints.atomic import STAGING, resume_checkpoint

SETTINGS = dict(
    max_steps=2,
    save_steps=1,
    logging_steps=1,
    learning_rate=5e-2,
    policy_sharing="isolated",
    seed=7,
)
ROLE_ADAPTERS = ("generator", "aggregator")


def trainer_for(model_dir, run):
    return tiny_trainer(model_dir, run, respond=half_right_answers, **SETTINGS)


def assert_complete(checkpoint, step: int) -> None:
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert (checkpoint / "multiagent_config.json").is_file() and (checkpoint / "optimizer.pt").is_file()
    for adapter in ROLE_ADAPTERS:
        assert (checkpoint / adapter / "adapter_model.safetensors").is_file()


def resume_to_the_end(model_dir, run, caplog) -> None:
    """A new run on the same folder resumes from checkpoint-1, saying that it ignores the unfinished save, and saves
    checkpoint-2 complete."""
    resumed = trainer_for(model_dir, run)
    loaded, load = [], resumed._load_model_weights
    resumed._load_model_weights = lambda checkpoint, model=None: loaded.append(checkpoint) or load(checkpoint, model)
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.checkpoints.atomic"):
        resumed.train(resume_from_checkpoint=True)
    assert "An interrupted save left checkpoint-2" in caplog.text
    assert loaded == [str(run / "checkpoint-1")] and resumed.state.global_step == 2
    assert_complete(run / "checkpoint-2", 2)
    assert not (run / STAGING).exists()  # the interrupted save's files went with the next save


def test_a_save_failing_on_a_full_disk_leaves_the_previous_checkpoint(tiny_model_dir, tmp_path, monkeypatch, caplog):
    run = tmp_path / "run"
    trainer = trainer_for(tiny_model_dir, run)
    write = role_adapters.save_run_files

    def disk_full_midway(folder, *args, **kwargs):
        write(folder, *args, **kwargs)  # the role adapters are written, the optimizer and trainer state not yet
        if trainer.state.global_step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(role_adapters, "save_run_files", disk_full_midway)
    with pytest.raises(OSError, match="No space left on device"):
        trainer.train()
    monkeypatch.undo()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert_complete(run / "checkpoint-1", 1)
    partial = run / STAGING / "checkpoint-2"
    assert (partial / "generator").is_dir() and not (partial / "trainer_state.json").exists()
    resume_to_the_end(tiny_model_dir, run, caplog)


@pytest.mark.slow
def test_a_save_killed_midway_leaves_the_previous_checkpoint(tiny_model_dir, tmp_path, caplog):
    run = tmp_path / "run"
    worker = [sys.executable, str(TESTS / "workers" / "kill_mid_save_worker.py"), tiny_model_dir, str(run)]
    with pytest.raises(AssertionError, match="exited -9"):
        run_offline(worker)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert_complete(run / "checkpoint-1", 1)
    assert (run / STAGING / "checkpoint-2" / "generator").is_dir()
    resume_to_the_end(tiny_model_dir, run, caplog)


def test_resume_takes_the_newest_complete_checkpoint_naming_those_it_skipped(tmp_path, caplog):
    for step, files in ((1, ("trainer_state.json", "multiagent_config.json")), (2, ("trainer_state.json",)), (3, ())):
        (tmp_path / f"checkpoint-{step}" / "generator").mkdir(parents=True)  # e.g. saved in place by an old version
        for name in files:
            (tmp_path / f"checkpoint-{step}" / name).write_text("{}")
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.checkpoints.atomic"):
        assert resume_checkpoint(tmp_path) == str(tmp_path / "checkpoint-1")
    assert (
        f"skipped the newer {tmp_path}/checkpoint-3 (no trainer_state.json and no multiagent_config.json"
        in caplog.text
    )
    assert f"{tmp_path}/checkpoint-2 (no multiagent_config.json: its save did not finish)" in caplog.text

    (tmp_path / "checkpoint-1" / "multiagent_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="No complete checkpoint in .* to resume from: skipped"):
        resume_checkpoint(tmp_path)
    assert resume_checkpoint(tmp_path / "empty") is True  # nothing at all: the Trainer's own error follows
