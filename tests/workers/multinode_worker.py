"""Run by tests/training/test_multinode.py, one process per rank (two `accelerate launch` "nodes", or one launch of
two processes): 2 steps of each case, every rank's adapters saved. A case is `Workflow:update` or
`Workflow:update:sharing` (`update` as `tiny.update_settings` names it; isolated policy unless named).

One launch trains every case in turn, so the distributed start-up is paid once; each case is a fresh trainer with
the same seed, and each rank scripts its rollouts from its own global rank, so a run on two machines and a run of
two processes on one machine see the same data on the same rank.
"""

import json
import os
import sys

import torch
from scripted import addition_dataset
from tiny import half_right_answers, tiny_trainer, update_settings

from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.checkpoints import BUILT_IN_WORKFLOWS

torch.set_num_threads(1)


def adapter_weights(trainer, adapter: str) -> dict:
    params = adapter_parameters(trainer.model, adapter)
    if trainer.is_deepspeed_enabled:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values())):  # ZeRO-3 partitions them; a no-op otherwise
            return {name: p.detach().clone() for name, p in params.items()}
    return {name: p.detach().clone() for name, p in params.items()}


model_dir, out_dir, *cases = sys.argv[1:]
rank = int(os.environ["RANK"])
topology = {}
for case in cases:
    workflow, update, *sharing = case.split(":")
    settings = dict(
        max_steps=2,
        logging_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        policy_sharing=sharing[0] if sharing else "isolated",
        seed=0,
        **update_settings(update),
    )
    trainer = tiny_trainer(
        model_dir,
        os.path.join(out_dir, case.replace(":", "-")),
        BUILT_IN_WORKFLOWS[workflow](),
        dataset=addition_dataset(4),
        respond=half_right_answers,
        respond_seed=100 + rank,
        **settings,
    )
    before = {adapter: adapter_weights(trainer, adapter) for adapter in trainer._updates.installed.adapter_names}
    trainer.train()
    weights = {adapter: adapter_weights(trainer, adapter) for adapter in trainer._updates.installed.adapter_names}
    torch.save(weights, os.path.join(out_dir, f"{case.replace(':', '-')}-rank{rank}.pt"))
    torch.save(before, os.path.join(out_dir, f"{case.replace(':', '-')}-rank{rank}-before.pt"))
    state = trainer.accelerator.state
    topology[case] = {
        "steps": trainer.state.global_step,
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "local_process_index": state.local_process_index,
        "backend": state.backend,
        "distributed_type": str(state.distributed_type),
        "zero_stage": trainer.model_wrapped.zero_optimization_stage() if trainer.is_deepspeed_enabled else None,
        # the optimizer steps DeepSpeed's engine took (it steps after a backward made while gradients sync)
        "engine_steps": trainer.model_wrapped.global_steps if trainer.is_deepspeed_enabled else None,
        # each step's optimizer updates: one, or one per mini-batch (`adapter/<name>/optimizer_steps` adds them up)
        "updates": [
            sum(v for k, v in h.items() if k.endswith("/optimizer_steps")) or 1
            for h in trainer.state.log_history
            if "loss" in h
        ],
    }
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(topology, f)
