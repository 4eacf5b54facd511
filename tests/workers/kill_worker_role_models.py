"""Run by tests/adapters/test_role_models.py: Eval-Opt with the evaluator on a second base model, 8 steps with a
checkpoint every 4, optionally resumed."""

import json
import sys

import torch
from adapters.test_role_models import length_parity_reward
from tiny import tiny_trainer

from trl_multiagent import EvalOpt

torch.set_num_threads(1)
model_dir, judge_dir, output_dir = sys.argv[1], sys.argv[2], sys.argv[3]
resume = sys.argv[4] if len(sys.argv) > 4 else None
settings = dict(
    max_steps=8,
    save_steps=4,
    logging_steps=1,
    learning_rate=5e-2,
    policy_sharing="isolated",
    seed=7,
    role_models={"evaluator": judge_dir},
    beta=0.1,  # the per-role KL to each role's own base: after the first step the losses carry signal
)
trainer = tiny_trainer(model_dir, output_dir, EvalOpt(max_iterations=2), reward_funcs=length_parity_reward, **settings)
trainer.train(resume_from_checkpoint=resume)
losses = {int(h["step"]): h["loss"] for h in trainer.state.log_history if "loss" in h}
trainer.save_model(f"{output_dir}/final")
with open(f"{output_dir}/losses.json", "w") as f:
    json.dump(losses, f)
