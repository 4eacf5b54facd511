"""Run by tests/training/test_deepspeed.py under `deepspeed --num_gpus 1` (CPU accelerator): 2 steps of Voting
through the DeepSpeed engine (the ZeRO stage comes from the config file), every role adapter's move measured."""

import json
import sys

import deepspeed
import torch
from tiny import half_right_answers, tiny_trainer

from trl_multiagent.adapters.routing import adapter_parameters

torch.set_num_threads(1)
model_dir, output_dir, ds_config, sharing = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
settings = dict(max_steps=2, logging_steps=1, learning_rate=5e-2, policy_sharing=sharing, save_strategy="no")
trainer = tiny_trainer(model_dir, output_dir, deepspeed=ds_config, respond=half_right_answers, **settings)


def adapter_weights(adapter: str) -> dict:
    params = adapter_parameters(trainer.model, adapter)
    with deepspeed.zero.GatheredParameters(list(params.values())):  # ZeRO-3 partitions them; a no-op otherwise
        return {n: p.detach().clone() for n, p in params.items()}


before = {a: adapter_weights(a) for a in trainer.adapter_names}
trainer.train()
after = {a: adapter_weights(a) for a in trainer.adapter_names}
result = {
    "engine": type(trainer.model_wrapped).__name__,
    "zero_stage": trainer.model_wrapped.zero_optimization_stage(),
    "steps": trainer.state.global_step,
    "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    "moved": {a: max((after[a][n] - w).abs().max().item() for n, w in before[a].items()) for a in before},
}
with open(f"{output_dir}/result.json", "w") as f:
    json.dump(result, f)
