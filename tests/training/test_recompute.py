"""Gradient checkpointing chosen per forward by memory (`activation_memory_gb`, training/recompute.py): forwards cut to
what fits run without recompute, a sample too long for it alone recomputes, and the update is the one TRL's
`gradient_checkpointing` on every forward gives."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_forward_padding import assert_same_update, record_gradients, uneven_answers
from tiny import ONE_SGD_STEP, tiny_trainer

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig
from trl_multiagent.seams.transformers import checkpointing_on
from trl_multiagent.training.recompute import GB, ActivationShape, activation_bytes_per_token, recomputes

FIT = 400  # tokens per forward the memory below holds; the tiny Eval-Opt calls hold about 80 to 450


def record_checkpointing(trainer) -> list[tuple[int, bool]]:
    """(tokens, whether checkpointing was on) of every forward with gradients the model's decoder receives."""
    seen = []

    def record(module, args, kwargs):
        if torch.is_grad_enabled():
            seen.append((kwargs["input_ids"].numel(), checkpointing_on(trainer.model)))

    trainer.model.get_base_model().model.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def train(model_dir, output_dir, **config):
    trainer = tiny_trainer(
        model_dir,
        output_dir,
        EvalOpt(max_iterations=2),
        respond=uneven_answers,
        policy_sharing="isolated",
        update_schedule="mini_batches",
        mini_batch_prompts=1,
        gradient_accumulation_steps=2,
        **ONE_SGD_STEP,
        **config,
    )
    gradients, forwards = record_gradients(trainer), record_checkpointing(trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    # transformers 5.25 renamed the property that says whether checkpointing is on; its old name warns at each read,
    # so the per-forward choice (and the recorder above) read the new one
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    return trainer, gradients, trainer.state.log_history[0]["loss"], forwards


def test_forwards_that_fit_skip_checkpointing_and_train_the_same(tiny_model_dir, tmp_path):
    trainer, *reference, every = train(tiny_model_dir, tmp_path / "trl")
    assert every and all(on for _, on in every)  # TRL's default: every forward recomputes
    shape = ActivationShape.of(trainer.model.config, lora_rank=4, compute_bytes=4, lora_bytes=4)
    memory_gb = (FIT + 0.5) * activation_bytes_per_token(shape) / GB  # tiny_lora's rank 4, float32
    trainer, *ours, chosen = train(tiny_model_dir, tmp_path / "memory", activation_memory_gb=memory_gb)
    assert trainer._step_forwards.forwards("train", backward=True).fit == FIT
    assert_same_update(*ours, *reference)
    assert all(on == (tokens > FIT) for tokens, on in chosen)  # one sample a row: tokens held, padding included
    assert any(on for _, on in chosen) and not all(on for _, on in chosen)
    assert checkpointing_on(trainer.model)  # back on after each forward that fitted


def test_recompute_follows_gradient_checkpointing_and_memory():
    assert recomputes(10, fit=None, gradient_checkpointing=True)  # TRL's: every forward
    assert not recomputes(10**6, fit=None, gradient_checkpointing=False)
    assert not recomputes(400, fit=400, gradient_checkpointing=True) and recomputes(
        401, fit=400, gradient_checkpointing=True
    )
    assert not recomputes(401, fit=400, gradient_checkpointing=False)


def test_activation_memory_gb_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="activation_memory_gb"):
        MultiAgentGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, activation_memory_gb=0)
