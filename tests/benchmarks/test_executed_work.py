"""benchmarks/executed_work.py reads what a step ran: its FLOPs equal the ones torch counts for a padded forward and
backward with recompute, and it tells apart the masks and kernels that reached attention."""

from __future__ import annotations

import sys

import pytest
import torch
from harness import ROOT
from peft import LoraConfig, get_peft_model
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM
from trl.trainer.utils import add_fused_lm_head

sys.path.insert(0, str(ROOT / "benchmarks"))
from executed_work import ExecutedWork  # noqa: E402


def tiny_lora_model(attention: str, rank: int = 4, fused_head: bool = False):
    config = Qwen3Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=96,
        vocab_size=320,
        tie_word_embeddings=True,
        attn_implementation=attention,
    )
    torch.manual_seed(0)
    base = Qwen3ForCausalLM(config)
    if fused_head:  # as TRL's GRPOTrainer does: log-probs in tiles, without the logits
        add_fused_lm_head(base)
    model = get_peft_model(base, LoraConfig(r=rank, target_modules="all-linear"))
    model.enable_input_require_grads()  # as TRL does under gradient checkpointing
    return model


def left_padded(lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return torch.randint(0, vocab, (len(lengths), width)), mask


class Phase:
    name: str | None = None

    def __call__(self):
        return self.name


def loss_step(model, phase: Phase, input_ids, mask, keep: int, fused_head: bool) -> None:
    phase.name = "loss_forward"
    if fused_head:
        labels = input_ids.masked_fill(mask == 0, -100)
        labels[:, :-keep] = -100
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs.sum()
    else:
        loss = model(input_ids=input_ids, attention_mask=mask, logits_to_keep=keep).logits.float().sum()
    phase.name = "backward"
    loss.backward()
    phase.name = None


@pytest.mark.parametrize("checkpointing, fused_head", [(False, False), (True, False), (True, True)])
def test_executed_flops_equal_torchs_count_of_a_padded_step(checkpointing, fused_head):
    """Eager attention with padding multiplies full squares, as torch's counter counts them; with checkpointing the
    layers run again during backward, and both counts include them; TRL's fused LM head recomputes its tiles in
    backward, and both count that too."""
    model = tiny_lora_model("eager", fused_head=fused_head)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    phase = Phase()
    work = ExecutedWork(model, phase)
    input_ids, mask = left_padded([9, 23, 16], model.config.vocab_size)
    with FlopCounterMode(display=False) as counted:
        loss_step(model, phase, input_ids, mask, keep=7, fused_head=fused_head)
    work.remove()
    loss = work.phases["loss_forward"]
    # The fused head's input gradient is an in-place ``addmm_``, which torch's counter has no entry for.
    unseen = 2 * 3 * 22 * 64 * 320 if fused_head else 0
    assert loss.executed_flops() == pytest.approx(counted.get_total_flops() + unseen, rel=1e-9)
    assert (loss.recomputed_layers > 0) == checkpointing
    assert loss.forwards == 1 and loss.widths == [(3, 23)]
    assert (loss.real_tokens, loss.padded_tokens) == (48, 3 * 23 - 48)
    assert loss.squared_lengths == 9**2 + 23**2 + 16**2
    assert dict(loss.masks) == {"dense 4-D mask": 2}
    assert work.lora_dtypes() == ["float32"]
    # The LM head scores the last 7 positions of each row through the Linear; TRL's fused head on CPU scores every
    # position but the last (only on Triton devices does it skip the positions without a label).
    assert loss.lm_head_positions == (3 * 22 if fused_head else 3 * 7)


def test_a_padded_forward_hands_sdpa_a_mask_and_an_unpadded_one_the_causal_kernel():
    model = tiny_lora_model("sdpa")
    phase = Phase()
    work = ExecutedWork(model, phase)
    phase.name = "logps_before_update"
    with torch.no_grad():
        model(*left_padded([5, 12], model.config.vocab_size))
        model(*left_padded([12, 12], model.config.vocab_size))
    before = work.phases["logps_before_update"]
    assert before.forwards == 2 and before.padded_tokens == 7
    assert dict(before.masks) == {"dense 4-D mask": 2, "none (causal kernel)": 2}
    assert sum(before.kernels.values()) == 2  # one reading per forward, whichever kernel CPU's SDPA picked
    assert before.backward_flops == 0  # no gradient: nothing to count for a backward
    square, triangle = 2 * 12 * 12, 2 * 12 * 13 / 2
    heads, head_dim = 4, 32
    assert before.attention_flops == 2 * 4 * (square + triangle) * heads * head_dim  # 2 layers x 4 FLOPs a pair
    # The padded forward's square holds a triangle for each of its samples (5 and 12 tokens); the rest is waste.
    beyond = 2 * 4 * (square - (5 * 6 / 2 + 12 * 13 / 2)) * heads * head_dim
    assert before.attention_beyond_causal_flops == beyond
    lm_head = 2 * 24 * 2 * 64 * 320  # every position of both forwards, no logits_to_keep
    assert before.padding_flops == pytest.approx((before.linear_flops - lm_head) / 2 * 7 / 24)


def test_rows_packed_with_several_samples_count_each_samples_triangle():
    model = tiny_lora_model("sdpa")
    phase = Phase()
    work = ExecutedWork(model, phase)
    phase.name = "loss_forward"
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])
    with torch.no_grad():
        model(input_ids=torch.randint(0, 320, (1, 10)), position_ids=positions)
    loss = work.phases["loss_forward"]
    assert loss.real_tokens == 10 and loss.padded_tokens == 0
    assert loss.squared_lengths == 16 + 9 + 9
    work.remove()
    with torch.no_grad():
        model(input_ids=torch.randint(0, 320, (1, 10)), position_ids=positions)
    assert work.phases["loss_forward"].forwards == 1  # removed hooks record nothing more
