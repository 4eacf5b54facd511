"""The learning rate of the paper preset's cosine (peak 2e-5, 15 warm-up steps, max_steps 500) at chosen training
steps, with k adapters, under each `lr_scheduler_steps`: the Trainer's scheduler as the trainer steps it (through
`UpdateCallScheduler` for "per_update"), not a formula. Under "per_update" the first adapter's rate of the step is
shown (adapter i of a step trains at scheduler index k * step + i).

    python scripts/lr_schedule_table.py
"""

from __future__ import annotations

import argparse

import torch
from transformers import get_scheduler

from trl_multiagent.adapters.per_update_lr import UpdateCallScheduler


def first_adapter_rates(k: int, mode: str, steps: list[int], peak: float, warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=warmup, num_training_steps=total)
    if mode == "per_update":
        scheduler = UpdateCallScheduler(scheduler, calls_per_step=k)
    rates = {}
    for step in range(max(steps) + 1):
        for adapter in range(k):  # the sequential mini-batch schedule: one update call per adapter
            if mode == "per_update":
                scheduler.starts(f"adapter{adapter}")
            rates.setdefault(step, optimizer.param_groups[0]["lr"])
            optimizer.step()
        scheduler.step()
    return [rates[s] for s in steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 15, 100, 250, 400, 500])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 2, 3, 5])
    parser.add_argument("--peak", type=float, default=2e-5)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--max_steps", type=int, default=500)
    args = parser.parse_args()
    print("| lr_scheduler_steps | k | " + " | ".join(f"step {s}" for s in args.steps) + " |")
    print("|---|---|" + "---|" * len(args.steps))
    for mode in ("per_training_step", "per_update"):
        for k in args.adapters:
            rates = first_adapter_rates(k, mode, args.steps, args.peak, args.warmup, args.max_steps)
            print(f"| {mode} | {k} | " + " | ".join(f"{r:.2e}" for r in rates) + " |")


if __name__ == "__main__":
    main()
