"""Run by tests/training/test_deepspeed_role_models.py: 2 steps of Eval-Opt with the evaluator on a second base model
(`role_models`), through the DeepSpeed engine when launched by `deepspeed` with a config file, or without DeepSpeed
when the config argument is `none`; per-role KL on (each role's reference pass through its own base), a checkpoint at
every step; resumed from a checkpoint when given one. Writes each adapter's weights before and after
(`rank<r>-before/after.safetensors`) and `rank<r>.json`."""

import json
import os
import sys

import torch
from adapters.test_role_models import length_parity_reward
from safetensors.torch import save_file
from tiny import tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters

torch.set_num_threads(1)
args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
model_dir, judge_dir, output_dir, ds_config, checkpointing, *resume = args  # resume: a checkpoint to resume from
settings = dict(
    max_steps=2,
    save_steps=1,
    logging_steps=1,
    learning_rate=5e-2,
    policy_sharing="isolated",
    seed=0,
    beta=0.1,
    role_models={"evaluator": judge_dir},
    gradient_checkpointing=checkpointing == "checkpointing",
)
if ds_config != "none":
    settings["deepspeed"] = ds_config
trainer = tiny_trainer(model_dir, output_dir, EvalOpt(max_iterations=2), reward_funcs=length_parity_reward, **settings)
models = {"generator": trainer.model, "evaluator": trainer.bases.extra[judge_dir].model}


def adapter_weights() -> dict[str, torch.Tensor]:
    weights = {}
    for adapter, model in models.items():
        params = adapter_parameters(model, adapter)
        if any(hasattr(p, "ds_id") for p in params.values()):  # partitioned by ZeRO-3: gathered to read
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(params.values())):
                weights.update({f"{adapter}/{n}": p.detach().clone() for n, p in params.items()})
        else:
            weights.update({f"{adapter}/{n}": p.detach().clone() for n, p in params.items()})
    return weights


rank = int(os.environ.get("RANK", "0"))
save_file(adapter_weights(), f"{output_dir}/rank{rank}-before.safetensors")
trainer.train(resume_from_checkpoint=resume[0] if resume else None)
save_file(adapter_weights(), f"{output_dir}/rank{rank}-after.safetensors")
engine = trainer.model_wrapped
result = {
    "engine": type(engine).__name__,
    "zero_stage": engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None,
    "world_size": trainer.accelerator.num_processes,
    "steps": trainer.state.global_step,
    "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    "log_history": trainer.state.log_history,
    "main_state_keys": sorted(trainer.model.state_dict()),
}
with open(f"{output_dir}/rank{rank}.json", "w") as f:
    json.dump(result, f)
