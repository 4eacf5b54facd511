"""Run by tests/rollout/vllm_backends/test_vllm_two_runs.py: a run beside another on the same `vllm serve` server,
with the same role names, saving every step until the file ``stop`` appears in its output folder (at most 60 steps).
At the end it checks that every call was served by its own adapters at their own versions (``server_runs.py``), then
writes ``stamps.json``: per rollout, the step and every call's (role, adapter, version) as the server said."""

import json
import sys
from pathlib import Path

import torch
from server_runs import assert_served_by_own_adapters, randomize_adapters, record_stamps, server_trainer
from transformers import TrainerCallback

torch.set_num_threads(1)
model_dir, output_dir, url = sys.argv[1], Path(sys.argv[2]), sys.argv[3]


class StopWhenAsked(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if (output_dir / "stop").exists():
            control.should_training_stop = True


trainer = server_trainer(model_dir, output_dir, url, max_steps=60, save_steps=1)
trainer.add_callback(StopWhenAsked())
randomize_adapters(trainer, seed=2)
stamps = record_stamps(trainer)
trainer.train()
assert_served_by_own_adapters(trainer, stamps)
seen = [[step, sorted([role, p.adapter, p.version] for role, p in calls)] for step, calls in stamps]
(output_dir / "stamps.json").write_text(json.dumps({"run": trainer.rollout_backend.served.run, "rollouts": seen}))
