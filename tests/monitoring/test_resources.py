"""`monitor_resources`: what the training process holds, logged with every step, so that a leak shows as a climb."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from harness import ROOT, run_offline
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer
from transformers import TrainerCallback

from trl_multiagent import Voting

METRICS = ("rss_mb", "open_fds", "threads", "child_processes", "output_dir_mb")


class Leaks(TrainerCallback):
    """Leaves an open file, a child process and a 1 MB file in output_dir behind at every step."""

    def __init__(self, output_dir):
        self.output_dir = output_dir
        self.held = []

    def on_step_end(self, args, state, control, **kwargs):
        self.held.append(open(__file__))  # noqa: SIM115 - held open on purpose
        self.held.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))
        (self.output_dir / f"junk-{state.global_step}.bin").write_bytes(b"x" * 2**20)

    def close(self):
        for thing in self.held:
            if isinstance(thing, subprocess.Popen):
                thing.kill()
                thing.wait()
            else:
                thing.close()


def train(tiny_model_dir, output_dir, **config):
    trainer = tiny_trainer(
        tiny_model_dir,
        output_dir,
        Voting(prompts="guarded"),
        dataset=addition_dataset(4),
        respond=random_answers,
        per_device_train_batch_size=8,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        **config,
    )
    return trainer


def test_each_step_logs_what_the_process_holds_and_a_leak_shows(tiny_model_dir, tmp_path):
    trainer = train(tiny_model_dir, tmp_path, monitor_resources=True)
    leaks = Leaks(tmp_path)
    trainer.add_callback(leaks)
    try:
        trainer.train()
    finally:
        leaks.close()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(f"resources/{m}" in h for h in logs for m in METRICS)
    column = {m: [h[f"resources/{m}"] for h in logs] for m in METRICS}
    # Sampled at each step's log, after that step's leak: one more file, one more child, one more MB each step.
    assert [b - a for a, b in zip(column["open_fds"], column["open_fds"][1:])] == [1, 1]
    assert [b - a for a, b in zip(column["child_processes"], column["child_processes"][1:])] == [1, 1]
    assert [round(b - a, 2) for a, b in zip(column["output_dir_mb"], column["output_dir_mb"][1:])] == [1.0, 1.0]
    assert column["rss_mb"][0] > 50 and column["threads"][0] >= 1


def test_off_by_default(tiny_model_dir, tmp_path):
    trainer = train(tiny_model_dir, tmp_path)
    trainer.train()
    assert not any(key.startswith("resources/") for h in trainer.state.log_history for key in h)


@pytest.mark.slow
def test_a_100_step_run_stays_flat(tmp_path):
    """benchmarks/long_run.py's short form: 100 steps of the toy preset's Eval-Opt run on a tiny model (the toy model
    takes 4-30 s a step here; what is measured is the trainer's and the checkpoints' footprint, which the model's
    size does not change in kind), a checkpoint every 10 steps with the last 2 kept. After 20 warm-up steps, memory,
    fds, threads, child processes and the output folder each grow less than their bound per 1,000 steps (the
    benchmark's docstring), at the upper end of a bootstrap 95% interval of the slope."""
    done = run_offline(
        [sys.executable, str(ROOT / "benchmarks" / "long_run.py"), "--tiny", "--steps", "100", "--minutes", "60"]
        + ["--output-dir", str(tmp_path), "--per_device_train_batch_size", "4", "--num_generations", "4"]
        + ["--max_completion_length", "8"],
        timeout=3900,
    )
    result = dict(re.findall(r"(\w+)=(\S+)", done.stdout.strip().splitlines()[-1]))
    assert (result["steps"], result["flat"]) == ("100", "yes"), done.stdout[-3000:]
    rows = (tmp_path / "resources.csv").read_text().splitlines()
    extra = ("trainer_state_mb", "checkpoints_mb", "log_history_mb", "rss_less_log_history_mb")
    header = ",".join(("step", *METRICS, *extra))
    assert rows[0] == header and len(rows) == 101
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-100", "checkpoint-90"]
    json.loads((tmp_path / "run" / "checkpoint-100" / "trainer_state.json").read_text())  # a whole checkpoint
