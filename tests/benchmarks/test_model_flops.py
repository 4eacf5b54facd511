"""benchmarks/model_flops.py's formula against the FLOPs torch counts on a tiny Qwen3 with a LoRA adapter: forward,
and backward with the base frozen (no weight gradients), the counts gpu_suite.py divides by time for MFU."""

from __future__ import annotations

import sys

import pytest
import torch
from harness import ROOT
from peft import LoraConfig, get_peft_model
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(ROOT / "benchmarks"))
from model_flops import DecoderShape, backward_flops, forward_flops  # noqa: E402


@pytest.mark.parametrize("tokens, completion, rank", [(40, 12, 4), (17, 17, 8), (64, 1, 2)])
def test_formula_counts_what_torch_counts(tokens, completion, rank):
    config = Qwen3Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=96,
        vocab_size=320,
        tie_word_embeddings=True,
        attn_implementation="eager",  # explicit matmuls, which the counter sees
    )
    torch.manual_seed(0)
    model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(r=rank, target_modules="all-linear"))
    model.enable_input_require_grads()  # as TRL does under gradient checkpointing: every activation gradient flows
    input_ids = torch.randint(0, config.vocab_size, (1, tokens))
    with FlopCounterMode(display=False) as forward:
        logits = model(input_ids=input_ids, logits_to_keep=completion).logits
    with FlopCounterMode(display=False) as backward:
        logits.float().sum().backward()

    shape = DecoderShape.of(config)
    # Eager attention multiplies the whole n x n score matrix, masked half included; the formula counts the causal
    # half a fused kernel computes.
    masked_half = shape.layers * 2 * tokens**2 * shape.heads * shape.head_dim
    assert (
        forward.get_total_flops()
        == forward_flops(shape, tokens=tokens, completion=completion, lora_rank=rank) + masked_half
    )
    assert (
        backward.get_total_flops()
        == backward_flops(shape, tokens=tokens, completion=completion, lora_rank=rank) + 2 * masked_half
    )
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)  # the base stays frozen


def test_frozen_base_backward_is_about_one_forward():
    """LoRA r=64 on Qwen3-1.7B's shape: a backward costs ~1 forward (full fine-tuning: ~2)."""
    shape = DecoderShape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=151936)
    forward = forward_flops(shape, tokens=4096, completion=3072, lora_rank=64)
    backward = backward_flops(shape, tokens=4096, completion=3072, lora_rank=64)
    assert 1.0 < backward / forward < 1.3
