"""Run by tests/training/test_ddp.py under torchrun, 2 processes: 2 steps of Eval-Opt whose evaluator rejects every
attempt on rank 0 (three attempts, six calls per episode) and accepts every one on rank 1 (two calls), so the two
ranks train on different numbers of samples, as Eval-Opt's ranks do in any real run."""

import json
import os
import sys

import torch
from tiny import tiny_trainer

from trl_multiagent import EvalOpt

torch.set_num_threads(1)
RANK = int(os.environ["RANK"])
model_dir, output_dir = sys.argv[1:]


def verdict_by_rank(requests, rng) -> list[str]:
    verdict = "Incorrect" if RANK == 0 else "Correct"
    return [f"\\boxed{{{verdict}}}" if r.adapter == "evaluator" else "\\boxed{3}" for r in requests]


settings = dict(max_steps=2, logging_steps=1, learning_rate=5e-2, policy_sharing="isolated", save_strategy="no")
settings.update(seed=0, per_device_train_batch_size=2)
trainer = tiny_trainer(model_dir, output_dir, EvalOpt(max_iterations=3), respond=verdict_by_rank, **settings)
trainer.train()
with open(f"{output_dir}/rank{RANK}.json", "w") as f:
    json.dump({"steps": trainer.state.global_step}, f)
