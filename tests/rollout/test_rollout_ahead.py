"""`rollout_ahead=1`: the next generation batch's episodes run on a worker thread while the current batch trains,
sampled with the adapters of one step before; every batch is still trained once, in the data's order.

Scripted rollouts (the trainer is told it has a vLLM backend; the script stands in for it); the importance-sampling
reweighing of the stale samples is checked on vLLM in test_vllm_async.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from presets import preset
from scripted import ScriptedBackend
from tiny import half_right_answers, tiny_config, tiny_trainer
from transformers import TrainerCallback

from trl_multiagent import EvalOpt


class SyncRecording(ScriptedBackend):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.synced_at: list[int] = []
        self.trainer = None

    def sync_adapters(self, model, names=None) -> None:
        self.synced_at.append(self.trainer.state.global_step)


class StepEnds(TrainerCallback):
    """Writes ("step end", n) to the event log; a step after which another batch follows waits (bounded, so that a
    rollout that does not run ahead fails the test instead of hanging it) for that batch's rollout to start first."""

    def __init__(self, events: list, started: dict[int, threading.Event], max_steps: int):
        self.events, self.started, self.max_steps = events, started, max_steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < self.max_steps:
            self.started[state.global_step].wait(timeout=60)
        self.events.append(("step end", state.global_step))


def test_the_next_batch_runs_while_this_one_trains(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    backend = SyncRecording(AutoTokenizer.from_pretrained(tiny_model_dir), half_right_answers)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        backend=backend,
        rollout_backend="vllm",
        rollout_ahead=1,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-2,
        save_strategy="no",
        seed=0,
    )
    backend.trainer = trainer
    events, started = [], {k: threading.Event() for k in range(3)}
    trainer.add_callback(StepEnds(events, started, max_steps=3))
    runs, asked, took = [], [], []
    run, episodes = trainer._rollout.rollouts.run, trainer._rollout.rollouts.episodes

    def recording_run(prompts):
        runs.append((prompts, threading.current_thread().name, trainer.state.global_step))
        events.append(("rollout", len(runs) - 1))
        started[len(runs) - 1].set()
        begun = time.perf_counter()
        done = run(prompts)
        took.append(time.perf_counter() - begun)
        return done

    def recording_episodes(prompts, training=True):
        asked.append((prompts, trainer.state.global_step))
        return episodes(prompts, training)

    trainer._rollout.rollouts.run, trainer._rollout.rollouts.episodes = recording_run, recording_episodes
    trainer.train()

    assert [step for _, step in asked] == [0, 1, 2]
    assert [prompts for prompts, *_ in runs] == [prompts for prompts, _ in asked]  # each batch run once, in order
    assert runs[0][1] == "MainThread" and [r[1] for r in runs[1:]] == ["rollout-ahead_0"] * 2
    assert [r[2] for r in runs] == [0, 0, 1]  # batch k+1 sampled with the adapters of step k
    # batch k+1's rollout started while step k trained (the step's end waits for it; without overlap it never would)
    assert events == [
        ("rollout", 0),
        ("rollout", 1),
        ("step end", 1),
        ("rollout", 2),
        ("step end", 2),
        ("step end", 3),
    ]
    assert backend.synced_at == [0, 1]  # before the first rollout, then the update of step 1 before batch 2 starts
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 3
    waits = [h["timing/rollout_wait_s"] for h in trainer.state.log_history if "timing/rollout_wait_s" in h]
    assert len(waits) == 3 and waits[0] >= took[0]  # the first step waited for its whole rollout, run on the spot


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(rollout_backend="transformers"), "rollout_ahead=1 overlaps the next rollout"),
        (dict(rollout_backend="vllm", update_schedule="mini_batches"), "update_schedule='merged'"),
        (dict(rollout_backend="vllm", rollout_ahead=2), "must be 0 or 1"),
    ],
)
def test_rollout_ahead_needs_a_separate_engine_and_the_merged_step(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **{"rollout_ahead": 1, **overrides})


def test_rollout_ahead_needs_the_sampling_correction(tiny_model_dir, tmp_path):
    # The paper preset turns the correction off (the reference has none); the error says how to turn it back on.
    paper = preset("paper_math")["vllm_importance_sampling_correction"]
    with pytest.raises(ValueError, match="add --vllm_importance_sampling_correction true, or set rollout_ahead=0"):
        tiny_trainer(
            tiny_model_dir,
            tmp_path,
            respond=half_right_answers,
            rollout_backend="vllm",
            rollout_ahead=1,
            vllm_importance_sampling_correction=paper,
        )
    with pytest.raises(ValueError, match="num_iterations=1"):
        tiny_trainer(
            tiny_model_dir,
            tmp_path,
            respond=half_right_answers,
            rollout_backend="vllm",
            rollout_ahead=1,
            num_iterations=2,
        )
