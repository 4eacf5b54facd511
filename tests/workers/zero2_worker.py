"""Run by tests/test_deepspeed.py under `deepspeed --num_gpus 1` (CPU accelerator): 2 ZeRO-2 steps of Voting."""

import json
import sys

import torch
from tiny import tiny_trainer

from trl_multiagent.adapters.routing import adapter_parameters

torch.set_num_threads(1)
model_dir, output_dir, ds_config = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
settings = dict(max_steps=2, logging_steps=1, learning_rate=5e-2, policy_sharing="isolated", save_strategy="no")
trainer = tiny_trainer(model_dir, output_dir, deepspeed=ds_config, **settings)
before = {
    a: {n: p.detach().clone() for n, p in adapter_parameters(trainer.model, a).items()} for a in trainer.adapter_names
}
trainer.train()
moved = {
    a: max((p.detach() - before[a][n]).abs().max().item() for n, p in adapter_parameters(trainer.model, a).items())
    for a in trainer.adapter_names
}
result = {
    "engine": type(trainer.model_wrapped).__name__,
    "zero_stage": trainer.model_wrapped.zero_optimization_stage(),
    "steps": trainer.state.global_step,
    "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    "moved": moved,
}
with open(f"{output_dir}/result.json", "w") as f:
    json.dump(result, f)
