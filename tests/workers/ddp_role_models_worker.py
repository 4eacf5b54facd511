"""Run by tests/adapters/test_role_models.py under `torchrun --nproc_per_node 2`: Eval-Opt with the evaluator on a
second base, 2 steps; each rank saves both bases' adapter weights and the completions it trained on."""

import json
import os
import sys

import torch
from adapters.test_role_models import length_parity_reward
from safetensors.torch import save_file
from scripted import addition_dataset
from tiny import tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters

torch.set_num_threads(1)
model_dir, judge_dir, out_dir, schedule = sys.argv[1:5]
rank = int(os.environ["RANK"])
trainer = tiny_trainer(
    model_dir,
    os.path.join(out_dir, "run"),
    EvalOpt(max_iterations=2),
    dataset=addition_dataset(8),
    reward_funcs=length_parity_reward,
    role_models={"evaluator": judge_dir},
    policy_sharing="isolated",
    update_schedule=schedule,
    max_steps=2,
    logging_steps=1,
    learning_rate=5e-2,
    save_strategy="no",
    seed=0,
)
completions, score = [], trainer._generate_and_score


def recording_score(inputs):
    batch = score(inputs)
    completions.append(batch.completion_ids.tolist())
    return batch


trainer._generate_and_score = recording_score
judge = trainer.bases.extra[judge_dir].model
before = {f"evaluator/{n}": p.detach().clone() for n, p in adapter_parameters(judge, "evaluator").items()}
before.update(
    {f"generator/{n}": p.detach().clone() for n, p in adapter_parameters(trainer.model, "generator").items()}
)
trainer.train()
weights = {f"evaluator/{n}": p.detach().contiguous() for n, p in adapter_parameters(judge, "evaluator").items()}
weights.update(
    {f"generator/{n}": p.detach().contiguous() for n, p in adapter_parameters(trainer.model, "generator").items()}
)
save_file(weights, os.path.join(out_dir, f"rank{rank}.safetensors"))
save_file(before, os.path.join(out_dir, f"rank{rank}-before.safetensors"))
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"completions": completions, "world_size": trainer.accelerator.num_processes}, f)
