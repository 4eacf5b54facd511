"""Loss forwards of the same number and sizes on every process.

With several processes, TRL's loss gathers one value per sample of each forward across processes (its clip-ratio
extremes) and reduces several metrics per forward, as the per-role metrics here do: every process must run as many
loss forwards as the others, the k-th of each holding as many rows. A workflow's episodes make different numbers of
calls on different processes (Eval-Opt stops when its evaluator accepts), so their forwards differ. Each process makes
up the difference with rows that train nothing (padding tokens, no completion token, zero advantage and weight),
appended to its forwards, and with forwards of such rows alone, placed before its last forward (the one that
synchronises gradients stays last).

TRL averages sequence-level losses over the rows of a forward; the real rows' weights are scaled by the rows after
padding over the rows before, so every sample's gradient, and the forward's loss, stay what they were. Token-level
losses divide by token counts, which rows without completion tokens leave unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace

import torch

from .batch import TrainingBatch
from .loss_weights import SEQUENCE_MEAN_LOSSES

MostOverProcesses = Callable[[torch.Tensor], torch.Tensor]  # elementwise max over processes of a same-shape tensor


def even_forwards(
    parts: list[TrainingBatch],
    *,
    most_over_processes: MostOverProcesses | None,
    pad_token_id: int,
    loss_type: str,
) -> list[TrainingBatch]:
    """``parts`` (the loss forwards of one micro-step on this process, in order) with as many forwards as the
    process with the most, the k-th padded to the most rows any process has in its k-th. Every process must call it
    the same number of times (it runs two collectives); without ``most_over_processes`` (one process) it returns
    ``parts``."""
    if most_over_processes is None:
        return parts
    if not parts:
        raise ValueError("A micro-step without any forward: every process needs at least one to stay in step.")
    device = parts[0].prompt_ids.device
    count = int(most_over_processes(torch.tensor([len(parts)], device=device)).item())
    stand_ins = [parts[-1].blank_rows(1, pad_token_id=pad_token_id) for _ in range(count - len(parts))]
    parts = parts[:-1] + stand_ins + parts[-1:]
    sizes = most_over_processes(torch.tensor([len(p) for p in parts], device=device)).tolist()
    return [
        padded(part, int(rows), pad_token_id=pad_token_id, loss_type=loss_type) for part, rows in zip(parts, sizes)
    ]


def padded(part: TrainingBatch, rows: int, *, pad_token_id: int, loss_type: str) -> TrainingBatch:
    """``part`` with rows that train nothing appended up to ``rows``, its rows' weights scaled so that TRL's loss
    of it, and its gradient, equal those of ``part``."""
    if rows < len(part):
        raise ValueError(f"Cannot pad a forward of {len(part)} rows to {rows}.")
    if rows == len(part):
        return part
    factor = rows / len(part) if loss_type in SEQUENCE_MEAN_LOSSES else 1.0
    scaled = replace(part, advantages=part.advantages * factor, sample_weights=part.sample_weights * factor)
    return _concatenated(scaled, part.blank_rows(rows - len(part), pad_token_id=pad_token_id))


def _concatenated(first: TrainingBatch, second: TrainingBatch) -> TrainingBatch:
    """The rows of ``first`` then those of ``second`` (of the same widths), every per-sample field alike."""
    joined = {}
    for f in fields(first):
        a, b = getattr(first, f.name), getattr(second, f.name)
        if isinstance(a, list):
            joined[f.name] = a + b
        elif torch.is_tensor(a) and a.dim() > 0:
            joined[f.name] = torch.cat([a, b])
    return replace(first, **joined)
