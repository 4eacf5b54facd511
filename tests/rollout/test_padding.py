"""Rows of token ids padded into one tensor, as TRL pads its prompts (left) and completions (right)."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import pad

from trl_multiagent.rollout.padding import padded

ROWS = [[5, 6, 7], [8], [], [9, 10]]


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_are_trls_padding_of_the_same_rows(side):
    ids, mask = padded(ROWS, 0, side=side)
    tensors = [torch.tensor(row, dtype=torch.long) for row in ROWS]
    assert torch.equal(ids, pad(tensors, padding_value=0, padding_side=side))
    assert torch.equal(mask, pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side=side))
    assert ids.dtype == mask.dtype == torch.long


def test_padded_takes_a_pad_per_row_a_width_and_no_pad_when_nothing_needs_one():
    ids, mask = padded([[1], [2, 3]], [7, 8], side="left", width=3)
    assert ids.tolist() == [[7, 7, 1], [8, 2, 3]] and mask.tolist() == [[0, 0, 1], [0, 1, 1]]
    assert padded([[1, 2], [3, 4]], None, side="right")[0].tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="set the tokenizer's pad_token"):
        padded([[1], [2, 3]], None, side="right")
