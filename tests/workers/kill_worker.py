"""Run by tests/test_kill_resume.py: 8 training steps with a checkpoint every 4, optionally resumed."""

import json
import sys

import torch
from peft import LoraConfig
from scripted import addition_dataset, boxed_answer_reward

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting

torch.set_num_threads(1)
model_dir, output_dir = sys.argv[1], sys.argv[2]
resume = sys.argv[3] if len(sys.argv) > 3 else None
trainer = MultiAgentGRPOTrainer(
    model=model_dir,
    workflow=Voting(prompts="guarded"),  # the requests on which these 8 steps' losses carry signal
    reward_funcs=boxed_answer_reward,
    args=MultiAgentGRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=8,
        save_steps=4,
        logging_steps=1,
        learning_rate=5e-2,
        report_to="none",
        policy_sharing="isolated",
        seed=7,
    ),  # fmt: skip
    train_dataset=addition_dataset(),
    peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
)
trainer.train(resume_from_checkpoint=resume)
losses = {int(h["step"]): h["loss"] for h in trainer.state.log_history if "loss" in h}
trainer.save_model(f"{output_dir}/final")
with open(f"{output_dir}/losses.json", "w") as f:
    json.dump(losses, f)
