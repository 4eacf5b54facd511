"""Run by tests/rollout/vllm_backends/test_vllm_server_lifecycle.py: a run on a `vllm serve` server, saving every step
for many steps, until the test kills it."""

import sys

import torch
from server_runs import randomize_adapters, server_trainer

torch.set_num_threads(1)
model_dir, output_dir, url = sys.argv[1], sys.argv[2], sys.argv[3]
trainer = server_trainer(model_dir, output_dir, url, max_steps=100, save_steps=1)
randomize_adapters(trainer, seed=0)
trainer.train()
