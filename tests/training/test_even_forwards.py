"""Loss forwards evened over processes (training/even_forwards.py): every process ends with as many forwards, the
k-th of the same size on each, and padding changes neither TRL's loss of a forward nor its gradient."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from tiny import half_right_answers, tiny_trainer

from trl_multiagent import SingleAgent
from trl_multiagent.training.batch import TrainingBatch
from trl_multiagent.training.even_forwards import even_forwards, padded
from trl_multiagent.training.loss_weights import loss_ready

PAD = 0


def batch_of(rows: int, *, adapter: str = "generator", width: int = 4, seed: int = 0) -> TrainingBatch:
    """``rows`` samples of ``adapter`` with ragged completions, advantages, weights and the log-probs the loss
    reads (old, reference)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, width, dtype=torch.long)
    for i in range(rows):
        mask[i, width - i % width :] = 0  # row i: width - (i mod width) tokens
    return TrainingBatch(
        prompt_ids=torch.randint(5, 50, (rows, 3), generator=g),
        prompt_mask=torch.ones(rows, 3, dtype=torch.long),
        completion_ids=torch.randint(5, 50, (rows, width), generator=g),
        completion_mask=mask,
        advantages=torch.randn(rows, generator=g),
        roles=[adapter] * rows,
        adapters=[adapter] * rows,
        instances=torch.zeros(rows, dtype=torch.long),
        episode_ids=torch.arange(rows),
        truncated=torch.zeros(rows, dtype=torch.bool),
        sample_weights=torch.rand(rows, generator=g) + 0.5,
        num_items_in_batch=mask.sum().float() * 2,
        num_samples_in_batch=torch.tensor(float(rows * 2)),
        old_per_token_logps=-1.0 - 0.3 * torch.rand(rows, width, generator=g),
        ref_per_token_logps=-1.0 - 0.3 * torch.rand(rows, width, generator=g),
    )


class TwoProcesses:
    """Two threads standing for two processes: `most(rank)` is rank's elementwise max over both (a barrier
    apart, as a collective is; tensors of different shapes fail as gloo does)."""

    def __init__(self):
        self.barrier = threading.Barrier(2, timeout=10)
        self.slots: list[torch.Tensor | None] = [None, None]

    def most(self, rank: int):
        def over_processes(tensor: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = tensor
            self.barrier.wait()
            result = torch.maximum(*self.slots)
            self.barrier.wait()
            return result

        return over_processes

    def run(self, parts_of_rank: list[list[TrainingBatch]], loss_type: str = "grpo") -> list[list[TrainingBatch]]:
        def on(rank: int):
            return even_forwards(
                parts_of_rank[rank], most_over_processes=self.most(rank), pad_token_id=PAD, loss_type=loss_type
            )

        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(on, range(2)))


def test_every_process_ends_with_the_same_forward_sizes_and_its_last_forward_last():
    rank0 = [batch_of(3), batch_of(1, adapter="evaluator"), batch_of(2, seed=1)]
    rank1 = [batch_of(1, adapter="evaluator"), batch_of(4, seed=2)]
    even0, even1 = TwoProcesses().run([rank0, rank1])

    assert [len(p) for p in even0] == [len(p) for p in even1] == [3, 1, 4]
    assert torch.equal(even1[-1].completion_ids[:4], rank1[-1].completion_ids)  # the synchronising forward last
    stand_in = even1[1]  # made up on rank 1: its last forward's adapter, nothing to train
    assert stand_in.adapters == ["generator"] and stand_in.completion_mask.sum() == 0
    assert stand_in.sample_weights.abs().sum() == 0 and stand_in.advantages.abs().sum() == 0
    for real, even in zip(rank0 + rank1, even0 + [even1[0], even1[2]]):
        blank = even.select(list(range(len(real), len(even))))
        assert blank.completion_mask.sum() == 0 and blank.sample_weights.abs().sum() == 0
        assert bool((blank.prompt_ids == PAD).all()) and blank.adapters == real.adapters[:1] * len(blank)
        assert blank.old_per_token_logps.shape == (len(blank), real.completion_ids.size(1))


def test_one_process_is_left_alone():
    parts = [batch_of(3)]
    assert even_forwards(parts, most_over_processes=None, pad_token_id=PAD, loss_type="grpo") is parts


def test_processes_with_different_numbers_of_forwards_and_equal_sizes_get_stand_ins_only():
    even0, even1 = TwoProcesses().run([[batch_of(2), batch_of(2, seed=1)], [batch_of(2, seed=2)]])
    assert [len(p) for p in even0] == [len(p) for p in even1] == [2, 2]
    assert even1[0].completion_mask.sum() == 0 and even1[0].sample_weights.abs().sum() == 0


LOSS_TYPES = ["grpo", "dr_grpo", "luspo", "sapo", "bnpo", "dapo", "cispo"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_padding_leaves_trls_loss_and_gradient_of_a_forward_unchanged(tiny_model_dir, tmp_path, loss_type):
    """Through the trainer's loss (TRL's `_compute_loss` for ``loss_type`` plus the per-role KL term, beta > 0):
    a forward of 4 rows and the same forward padded to 7 give the same loss and the same gradient in the real
    rows' log-probs; the padding rows get none, however unlikely their tokens."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        respond=half_right_answers,
        loss_type=loss_type,
        beta=0.05,
        policy_sharing="isolated",
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # set by the Trainer's loop, outside of which this runs
    part = loss_ready(batch_of(4), loss_type)
    logps = -1.0 - 0.2 * torch.rand(7, 4, generator=torch.Generator().manual_seed(3))
    logps[4:] = -200.0  # padding tokens a model finds very unlikely: exp(reference - log p) overflows unmasked

    def loss_and_gradient(batch: TrainingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        these = logps[: len(batch)].clone().requires_grad_(True)
        trainer._logps_and_entropies = lambda *a, **k: (these, torch.zeros_like(these), None)
        loss = trainer.compute_loss(trainer.model, batch)
        (gradient,) = torch.autograd.grad(loss, these)
        return loss, gradient

    loss, gradient = loss_and_gradient(part)
    padded_loss, padded_gradient = loss_and_gradient(padded(part, 7, pad_token_id=PAD, loss_type=loss_type))

    assert gradient.abs().sum() > 0
    assert padded_loss.item() == pytest.approx(loss.item(), rel=1e-6, abs=1e-9)
    assert torch.allclose(padded_gradient[:4], gradient, rtol=1e-5, atol=1e-9)
    assert padded_gradient[4:].abs().sum() == 0


def test_a_forward_is_never_cut():
    with pytest.raises(ValueError, match="Cannot pad a forward of 3 rows to 2"):
        padded(batch_of(3), 2, pad_token_id=PAD, loss_type="grpo")
