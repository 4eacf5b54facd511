"""Run by tests/training/test_ddp.py under `torchrun --nproc_per_node 2`: trains 2 steps, records what each rank
saw."""

import json
import os
import sys

import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

import trl_multiagent.training.advantages as advantages_module

torch.set_num_threads(1)
model_dir, out_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
record = {"rewards": [], "all_advantages": [], "local": []}

original = advantages_module.group_advantages


def recording_group_advantages(rewards, num_generations, scale_rewards="group"):
    advantages = original(rewards, num_generations, scale_rewards)
    record["rewards"].append(rewards.tolist())
    record["all_advantages"].append(advantages.tolist())
    return advantages


advantages_module.group_advantages = recording_group_advantages


settings = dict(
    max_steps=2, logging_steps=1, learning_rate=1e-2, save_strategy="no", policy_sharing="isolated", seed=0
)
trainer = tiny_trainer(
    model_dir,
    os.path.join(out_dir, "run"),
    dataset=addition_dataset(4),
    respond=random_answers,
    respond_seed=100 + rank,
    **settings,
)
score = trainer._generate_and_score


def recording_score(inputs):
    batch = score(inputs)
    record["local"].append(list(zip(batch.episode_ids.tolist(), batch.advantages.tolist())))
    return batch


trainer._generate_and_score = recording_score
trainer.train()
record["steps"] = trainer.state.global_step
record["world_size"] = trainer.accelerator.num_processes
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
