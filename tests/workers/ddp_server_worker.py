"""Run by tests/rollout/vllm_backends/test_vllm_server_ddp.py under `torchrun --nproc_per_node 2`: 2 steps through a
stand-in `vllm serve` server, recording what served each rank's calls."""

import json
import os
import sys

import torch
from tiny import tiny_trainer

from trl_multiagent import EvalOpt

torch.set_num_threads(1)
model_dir, out_dir, url = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ["RANK"])
server = dict(rollout_backend="vllm", vllm_mode="server", vllm_server_base_urls=url, vllm_server_timeout=60)
trainer = tiny_trainer(
    model_dir,
    os.path.join(out_dir, "run"),
    EvalOpt(max_iterations=1),
    policy_sharing="isolated",
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    seed=0,
    **server,
)
stamps, run = [], trainer.engine.run


def recording(prompts, on_episode_end=None):
    episodes = run(prompts, on_episode_end)
    calls = [c for e in episodes for c in e.calls]
    served = {(c.role, c.provenance.adapter, c.provenance.version, c.provenance.backend) for c in calls}
    stamps.append([trainer.state.global_step, sorted(served)])
    return episodes


trainer.engine.run = recording
trainer.train()
record = {"steps": trainer.state.global_step, "run": trainer.rollout_backend.served.run, "stamps": stamps}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
