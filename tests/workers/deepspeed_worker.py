"""Run by tests/training/test_deepspeed.py, one process: 2 steps of each case, through the DeepSpeed engine when
launched by `deepspeed` with a config file, or without DeepSpeed when the config argument is `none`. A case is
`Workflow:sharing:update` (`update` as `tiny.update_settings` names it). Each case is a fresh trainer with the same
seed and scripted rollouts; its adapters before and after training are saved (`<case>.pt`), and what it logged, the
engine's optimizer steps and the rows and padded tokens of every loss forward go to `result.json`."""

import json
import os
import sys

import torch
from scripted import addition_dataset
from tiny import half_right_answers, tiny_trainer, update_settings

from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.checkpoints import BUILT_IN_WORKFLOWS
from trl_multiagent.seams.deepspeed import gathered

torch.set_num_threads(1)
model_dir, output_dir, ds_config, *cases = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]


def adapter_weights(trainer) -> dict:
    weights = {}
    for adapter in trainer._updates.installed.adapter_names:
        params = adapter_parameters(trainer.model, adapter)
        with gathered(list(params.values())):  # whole under ZeRO-3, which partitions them
            weights[adapter] = {name: p.detach().clone() for name, p in params.items()}
    return weights


def train(case: str) -> dict:
    workflow, sharing, update = case.split(":")
    settings = dict(max_steps=2, logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0)
    settings["per_device_train_batch_size"] = 8  # two prompts a step: every step has groups to learn from
    if ds_config != "none":
        settings["deepspeed"] = ds_config
    folder = os.path.join(output_dir, case.replace(":", "-"))
    trainer = tiny_trainer(
        model_dir,
        folder,
        BUILT_IN_WORKFLOWS[workflow](),
        dataset=addition_dataset(4),
        respond=half_right_answers,
        policy_sharing=sharing,
        **settings,
        **update_settings(update),
    )
    forwards = []  # (rows, padded tokens) of every loss forward
    compute_loss = trainer.compute_loss

    def recorded(model, inputs, *args, **kwargs):
        forwards.append((len(inputs), inputs.prompt_ids.size(1) + inputs.completion_ids.size(1)))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recorded
    before = adapter_weights(trainer)
    trainer.train()
    torch.save({"before": before, "after": adapter_weights(trainer)}, f"{folder}.pt")
    engine = trainer.model_wrapped
    return {
        "engine": type(engine).__name__,
        "zero_stage": engine.zero_optimization_stage() if trainer.is_deepspeed_enabled else None,
        "engine_steps": engine.global_steps if trainer.is_deepspeed_enabled else None,
        "steps": trainer.state.global_step,
        "logs": [h for h in trainer.state.log_history if "loss" in h],
        "forwards": forwards,
    }


results = {case: train(case) for case in cases}
with open(os.path.join(output_dir, "result.json"), "w") as f:
    json.dump(results, f)
