"""One training step with the paper preset's batch fields scaled down: run by tests/training/test_paper_scale.py under
`torchrun --nproc_per_node 2`, and in the test's own process for one process. Records the per-process batch, the
episodes generated on this process and each adapter's optimizer steps."""

import json
import os
import sys

import torch
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer

from trl_multiagent import MultiAgentGRPOConfig, Voting

# The paper preset's batch fields (prompts_per_step 64, mini_batch_prompts 64, 8 episodes, 8 micro-steps) scaled down,
# with its mini-batch order (verl's, balanced over the processes); the per-process batch is left at its field default,
# for prompts_per_step to derive.
SETTINGS = dict(
    prompts_per_step=4,
    mini_batch_prompts=2,
    num_generations=2,
    gradient_accumulation_steps=2,
    update_schedule="mini_batches",
    mini_batch_order="reference",
    clip_grad_norm_per_adapter=True,
    advantage_groups="roles",
    per_device_train_batch_size=MultiAgentGRPOConfig.__dataclass_fields__["per_device_train_batch_size"].default,
    max_steps=1,
    logging_steps=1,
    learning_rate=1e-2,
    save_strategy="no",
    policy_sharing="isolated",
    seed=0,
)


def one_step(model_dir: str, out_dir: str, rank: int) -> dict:
    """Train one step; what this process saw."""
    trainer = tiny_trainer(
        model_dir,
        os.path.join(out_dir, "run"),
        Voting(),
        dataset=addition_dataset(8),
        respond=random_answers,
        respond_seed=100 + rank,
        **SETTINGS,
    )
    episodes, score = set(), trainer._generate_and_score

    def recording_score(inputs):
        batch = score(inputs)
        episodes.update(batch.episode_ids.tolist())
        return batch

    trainer._generate_and_score = recording_score
    trainer.train()
    logged = trainer.state.log_history[0]
    return {
        "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
        "episodes": len(episodes),
        "optimizer_steps": {
            a: logged[f"adapter/{a}/optimizer_steps"] for a in trainer._updates.installed.adapter_names
        },
        "samples_trained": logged["workflow/samples_trained"],
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    record = one_step(sys.argv[1], sys.argv[2], rank)
    with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
