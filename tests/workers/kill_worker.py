"""Run by tests/checkpoints/test_kill_resume.py: 8 training steps with a checkpoint every 4, optionally resumed."""

import json
import sys

import torch
from tiny import tiny_trainer

from trl_multiagent import Voting

torch.set_num_threads(1)
model_dir, output_dir = sys.argv[1], sys.argv[2]
resume = sys.argv[3] if len(sys.argv) > 3 else None
settings = dict(max_steps=8, save_steps=4, logging_steps=1, learning_rate=5e-2, policy_sharing="isolated", seed=7)
# the requests on which these 8 steps' losses carry signal
trainer = tiny_trainer(model_dir, output_dir, Voting(prompts="guarded"), **settings)
trainer.train(resume_from_checkpoint=resume)
losses = {int(h["step"]): h["loss"] for h in trainer.state.log_history if "loss" in h}
trainer.save_model(f"{output_dir}/final")
with open(f"{output_dir}/losses.json", "w") as f:
    json.dump(losses, f)
