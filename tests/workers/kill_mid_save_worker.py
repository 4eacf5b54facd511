"""Run by tests/checkpoints/test_atomic_save.py: 2 steps of Voting with a checkpoint after each; the process kills
itself with SIGKILL in the middle of the step-2 save, once the role adapters are written and before the optimizer and
the trainer state are."""

import os
import signal
import sys

import torch
from tiny import half_right_answers, tiny_trainer

import trl_multiagent.checkpoints.role_adapters as role_adapters

torch.set_num_threads(1)
model_dir, output_dir = sys.argv[1], sys.argv[2]
trainer = tiny_trainer(
    model_dir,
    output_dir,
    respond=half_right_answers,
    max_steps=2,
    save_steps=1,
    logging_steps=1,
    learning_rate=5e-2,
    policy_sharing="isolated",
    seed=7,
)
write = role_adapters.save_run_files


def killed_midway(folder, *args, **kwargs):
    write(folder, *args, **kwargs)
    if trainer.state.global_step == 2:
        os.kill(os.getpid(), signal.SIGKILL)


role_adapters.save_run_files = killed_midway
trainer.train()
