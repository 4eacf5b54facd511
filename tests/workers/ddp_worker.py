"""Run by tests/test_ddp.py under `torchrun --nproc_per_node 2`: trains 2 steps, records what each rank saw."""

import json
import os
import sys

import torch
from peft import LoraConfig
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from transformers import AutoTokenizer

import trl_multiagent.trainer as trainer_module
from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting

torch.set_num_threads(1)
model_dir, out_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
record = {"rewards": [], "all_advantages": [], "local": []}

original = trainer_module.group_advantages


def recording_group_advantages(rewards, num_generations, scale_rewards="group"):
    advantages = original(rewards, num_generations, scale_rewards)
    record["rewards"].append(rewards.tolist())
    record["all_advantages"].append(advantages.tolist())
    return advantages


trainer_module.group_advantages = recording_group_advantages


def random_answers(requests, rng):
    return [f"\\boxed{{{rng.randint(2, 5)}}}" for _ in requests]


tokenizer = AutoTokenizer.from_pretrained(model_dir)
trainer = MultiAgentGRPOTrainer(
    model=model_dir,
    workflow=Voting(),
    reward_funcs=boxed_answer_reward,
    args=MultiAgentGRPOConfig(
        output_dir=os.path.join(out_dir, "run"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        policy_sharing="isolated",
        seed=0,
    ),
    train_dataset=addition_dataset(4),
    peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    processing_class=tokenizer,
    rollout_backend=ScriptedBackend(tokenizer, random_answers, seed=100 + rank),
)
score = trainer._generate_and_score_completions


def recording_score(inputs):
    batch = score(inputs)
    record["local"].append(list(zip(batch.episode_ids.tolist(), batch.advantages.tolist())))
    return batch


trainer._generate_and_score_completions = recording_score
trainer.train()
record["steps"] = trainer.state.global_step
record["world_size"] = trainer.accelerator.num_processes
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
