"""Run by tests/training/test_ddp.py under torchrun, 2 processes: 2 steps of Eval-Opt whose evaluator rejects every
attempt on rank 0 (three attempts, six calls per episode) and accepts every one on rank 1 (two calls), so the two
ranks train on different numbers of samples, as Eval-Opt's ranks do in any real run; then an evaluation, whose
batches differ between the ranks alike. DDP under torchrun, DeepSpeed under `accelerate launch --use_deepspeed`.
Records each rank's steps, LoRA weights before and after, and losses."""

import json
import os
import sys

import torch
from scripted import addition_dataset
from tiny import tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters

torch.set_num_threads(1)
RANK = int(os.environ["RANK"])
model_dir, output_dir = sys.argv[1:]


def verdict_by_rank(requests, rng) -> list[str]:
    verdict = "Incorrect" if RANK == 0 else "Correct"
    return [
        f"\\boxed{{{verdict}}}" if r.adapter == "evaluator" else f"\\boxed{{{rng.randint(2, 5)}}}" for r in requests
    ]


def lora_weights(trainer) -> dict[str, list[float]]:
    weights = {}
    for adapter in ("generator", "evaluator"):
        params = adapter_parameters(trainer.model, adapter)
        if trainer.is_deepspeed_enabled:  # ZeRO-3 partitions them: gathered to read (a no-op otherwise)
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(params.values())):
                weights.update({f"{adapter}/{n}": p.detach().flatten().tolist() for n, p in params.items()})
        else:
            weights.update({f"{adapter}/{n}": p.detach().flatten().tolist() for n, p in params.items()})
    return weights


settings = dict(max_steps=2, logging_steps=1, learning_rate=5e-2, policy_sharing="isolated", save_strategy="no")
settings.update(seed=0, per_device_train_batch_size=2, beta=0.05)
trainer = tiny_trainer(
    model_dir,
    output_dir,
    EvalOpt(max_iterations=3),
    eval_dataset=addition_dataset(4),
    respond=verdict_by_rank,
    **settings,
)
before = lora_weights(trainer)
trainer.train()
metrics = trainer.evaluate()
record = {"steps": trainer.state.global_step, "before": before, "after": lora_weights(trainer)}
record["losses"] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
record["eval_loss"] = metrics["eval_loss"]
with open(f"{output_dir}/rank{RANK}.json", "w") as f:
    json.dump(record, f)
