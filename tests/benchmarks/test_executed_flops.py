"""benchmarks/executed_flops.py's count on an example small enough to check by hand: two samples in one forward,
through a one-layer model of a few weights, in each layout the count knows."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from harness import ROOT

from trl_multiagent.testing import batch_of_lengths, eval_opt_call_lengths

sys.path.insert(0, str(ROOT / "benchmarks"))
from executed_flops import Tally, add_forward, count_step, flex_pairs, model_flops  # noqa: E402
from model_flops import DecoderShape  # noqa: E402

# One layer, hidden 2, one head of 2, MLP 2, vocabulary 3: linear weights per layer q 4 + k 4 + v 4 + o 4 + gate 4 +
# up 4 + down 4 = 28; attention 2 x 2 x (heads x head size = 2) = 8 per (query, key) pair; LM head 2 x 2 x 3 = 12 per
# scored token. No LoRA (rank 0).
SHAPE = DecoderShape(hidden=2, layers=1, heads=1, kv_heads=1, head_dim=2, intermediate=2, vocab=3)


def two_samples():
    """Sample A: 2 prompt + 2 completion tokens; sample B: 1 + 1. One forward, one adapter."""
    return batch_of_lengths([[("generator", 2, 2)], [("generator", 1, 1)]], shared=True)


def loss_forward(held: int, pairs: int, *, recompute: bool) -> int:
    """By hand: forward 2 x 28 per token held + 8 per pair, LM head 12 per scored token (3 of them); backward
    2 x 28 per token (input gradients of the frozen weights) + 16 per pair + the head again; recompute: the layer's
    forward once more."""
    forward = 56 * held + 8 * pairs
    return forward + 36 + 56 * held + 16 * pairs + 36 + (forward if recompute else 0)


@pytest.mark.parametrize(
    "version, attention, rows, width, pairs, masked",
    [
        # ea897ce: rows end-aligned to width 4; B's padding makes a mask, so SDPA computes 2 x 4^2 pairs
        ("before", "sdpa", 2, 4, 32, True),
        # one sample a row, no mask: SDPA's causal kernel, 2 x (4 x 5 / 2) pairs
        ("after", "sdpa", 2, 4, 20, False),
        # packed into one row of 6, flash attention: A's 4 x 5 / 2 + B's 2 x 3 / 2
        ("after", "flash_attention_2", 1, 6, 13, False),
        # packed, flex attention: both samples inside one 128 x 128 block, computed whole
        ("after", "flex_attention", 1, 6, 128 * 128, False),
    ],
)
def test_a_loss_forward_counts_by_hand(version, attention, rows, width, pairs, masked):
    tally = Tally(shape=SHAPE, lora_rank=0)
    add_forward(tally, two_samples(), version=version, attention=attention, backward=True, fit=100)
    assert (tally.forwards, tally.widths, tally.held, tally.masked) == (1, [width], rows * width, int(masked))
    assert tally.recomputed == int(version == "before")  # before: every forward; after: 8 tokens fit in 100
    assert tally.executed == loss_forward(rows * width, pairs, recompute=version == "before")


def test_recompute_and_the_log_prob_forward_count_one_forward_each():
    recomputed, logps = Tally(shape=SHAPE, lora_rank=0), Tally(shape=SHAPE, lora_rank=0)
    add_forward(recomputed, two_samples(), version="after", attention="sdpa", backward=True, fit=7)  # 8 > 7 tokens
    add_forward(logps, two_samples(), version="after", attention="sdpa", backward=False, fit=7)
    assert recomputed.recomputed == 1 and recomputed.executed == loss_forward(8, 20, recompute=True)
    assert logps.recomputed == 0 and logps.executed == 56 * 8 + 8 * 20 + 36  # a forward, no backward


def test_model_flops_of_the_two_samples_by_hand():
    """A (4 tokens, 2 scored): forward 2 x 4 x 28 + 2 x 4^2 x 2 + 2 x 2 x 6 = 312, backward 224 + 4 x 16 x 2 + 24 =
    376; B (2 tokens, 1 scored): 112 + 16 + 12 = 140 and 112 + 32 + 12 = 156 (benchmarks/model_flops.py)."""
    assert model_flops(two_samples(), lora_rank=0, shape=SHAPE) == 312 + 376 + 140 + 156


def test_flex_counts_every_block_a_sample_touches():
    # 200 tokens then 100: the first covers blocks 0-1 (3 causal block pairs), the second blocks 1-2 (3 pairs), block
    # pair (1, 1) shared by both: 5 blocks computed whole.
    assert flex_pairs([200, 100]) == 5 * 128 * 128


@pytest.mark.parametrize("shared", [True, False])
def test_rollout_log_probs_drop_the_log_prob_forwards_and_keep_the_loss_forwards(shared):
    """A step of 4 problems x 4 Eval-Opt episodes in mini-batches of one problem: recomputed, the mini-batches after
    each adapter's first get a log-prob forward each; from the rollout (`old_logprobs="rollout"`), none, and the loss
    forwards are the same."""
    args = SimpleNamespace(
        batch_size=8,
        max_tokens=51_200,
        loss_type="grpo",
        lora_rank=8,
        pad_to_multiple_of=None,
        fit=None,
        mini_batch_prompts=1,
        episodes_per_problem=4,
        accumulation=2,
        mini_batch_order="episodes",
        seed=0,
    )
    batch = batch_of_lengths(eval_opt_call_lengths(16, seed=0), shared=shared)
    step = dict(schedule="mini_batches", version="after", attention="sdpa")
    recomputed_logps, recomputed_loss = count_step(batch, args, **step)
    rollout_logps, rollout_loss = count_step(batch, args, **step, old_logprobs="rollout")
    assert recomputed_logps.forwards > 0 and rollout_logps.forwards == 0 and rollout_logps.executed == 0
    assert (rollout_loss.forwards, rollout_loss.executed) == (recomputed_loss.forwards, recomputed_loss.executed)
