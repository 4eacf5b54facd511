"""The mini-batches of the reference stack's update: verl's length-balanced order of the whole batch, split per role.

Before its actor update the reference trainer (rLLM on verl 0.6.1, ``trainer.balance_batch: true``) reorders the
whole training batch so that every data-parallel rank gets a similar amount of work (``_balance_batch``,
verl/trainer/ppo/ray_trainer.py:919-950 at v0.6.1; called at rllm/trainer/verl/agent_workflow_trainer.py:538-539):

1. the batch is first padded to a multiple of the number of ranks with copies of its first samples
   (agent_workflow_trainer.py:531,1023-1055; verl/protocol.py:73-98);
2. each sample weighs ``24576 L + L^2``, ``L`` its tokens (prompt and completion: its attention mask), the cost of a
   dense transformer's forward (verl/utils/seqlen_balancing.py:27-34);
3. the samples are split into one partition per rank, all of the same size, with weights as even as the largest
   differencing method (Karmarkar-Karp) makes them (seqlen_balancing.py:37-138,161-202);
4. each partition is sorted by weight (ties by position) and laid out as its 1st, 3rd, 5th, ... samples followed by
   its 2nd, 4th, ... in reverse: short, rising to the longest, falling back to short (ray_trainer.py:943-947);
5. the partitions follow one another, rank 0's first, and each rank later receives its own.

rLLM then splits the batch per role, keeping that order, roles in the order they first appear, pads each role's
samples to a multiple of the ranks with copies of its first ones (agent_workflow_trainer.py:133-178,558,576), and
hands each role's samples to the actor, which gives each rank a contiguous equal share and cuts it into mini-batches
of ``ppo_mini_batch_size / ranks`` samples (verl/workers/actor/dp_actor.py:404; fsdp_workers.py:235-236); mini-batch
``k`` of the update is the ``k``-th cut of every rank's share. On one rank the middle mini-batch of a role thus holds
its longest samples.

``reference_mini_batches`` reproduces the samples of each mini-batch. The copies the reference trains on as well
(steps 1 and the per-role padding) take places in the order and in the mini-batches, as there; they are left out
of the mini-batches returned (every sample here trains once).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence


def workload(length: int) -> int:
    """verl's cost of a sample of ``length`` tokens (monotone in the length: ordering by it orders by length)."""
    return 24576 * length + length * length


class _Part:
    """One growing partition of the largest differencing method: its weight, its size and its items in the order
    they joined (the method's tie-breaks compare them in that order)."""

    __slots__ = ("items", "weight")

    def __init__(self, items: list[tuple[int, int]]):
        self.items = items  # (position, weight)
        self.weight = sum(weight for _, weight in items)

    def key(self) -> tuple:
        return self.weight, len(self.items), self.items


class _Candidate:
    """A k-way partial partition, its parts heaviest first; the heap pops the one with the widest spread first, then
    the one whose heaviest part is heaviest."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[_Part]):
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    def spread(self) -> int:
        return self.parts[0].weight - self.parts[-1].weight

    def __lt__(self, other: _Candidate) -> bool:
        if self.spread() != other.spread():
            return self.spread() > other.spread()
        return self.parts[0].key() > other.parts[0].key()

    def absorb(self, other: _Candidate) -> None:
        """Join the heaviest part of ``self`` with the lightest of ``other``, the second heaviest with the second
        lightest, and so on: the differencing step that evens the weights out."""
        for mine, theirs in zip(self.parts, reversed(other.parts)):
            mine.items = mine.items + theirs.items
            mine.weight += theirs.weight
        self.parts = sorted(self.parts, key=_Part.key, reverse=True)


def balanced_partitions(weights: Sequence[int], parts: int) -> list[list[int]]:
    """``parts`` partitions of the positions of ``weights``, each of ``len(weights) / parts`` positions, with sums as
    even as the largest differencing method makes them: verl's ``get_seqlen_balanced_partitions(equal_size=True)``.
    Partitions heaviest first, the positions of each in increasing order."""
    if parts < 1 or len(weights) % parts:
        raise ValueError(f"{len(weights)} samples do not split into {parts} partitions of one size.")
    ranked = sorted((weight, position) for position, weight in enumerate(weights))
    heap = [
        _Candidate([_Part([(position, weight)]) for weight, position in ranked[start : start + parts]])
        for start in range(0, len(ranked), parts)
    ]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.absorb(second)
        heapq.heappush(heap, first)
    return [sorted(position for position, _ in part.items) for part in heap[0].parts]


def _short_long_short(positions: list[int], weights: Sequence[int]) -> list[int]:
    ranked = sorted(positions, key=lambda position: (weights[position], position))
    return ranked[::2] + ranked[1::2][::-1]


def _padded(entries: list[int], ranks: int) -> list[int]:
    """``entries`` followed by copies of its first ones, up to a multiple of ``ranks`` (verl's padding)."""
    missing = -len(entries) % ranks
    return entries + [entries[i % len(entries)] for i in range(missing)]


def reference_mini_batches(
    lengths: Sequence[int], keys: Sequence[Hashable], *, mini_batch_size: int, ranks: int
) -> list[tuple[Hashable, list[int]]]:
    """The reference's mini-batches of a batch (module docstring): ``(key, positions)`` per optimizer step, in the
    order the steps are taken. ``lengths`` are the samples' tokens, ``keys`` what the update is split by (each
    sample's adapter), both in the batch's order; ``mini_batch_size`` counts samples over all ``ranks``. Padding
    copies are left out of the positions, so a mini-batch may hold fewer samples than the reference's."""
    if not lengths:
        return []
    if mini_batch_size < ranks:
        raise ValueError(f"A mini-batch of {mini_batch_size} samples does not give each of {ranks} ranks one.")
    # An entry is a place in the reference's batch: (position of the sample, whether it is a padding copy).
    entries = [(position, False) for position in range(len(lengths))]
    entries = entries + [(position, True) for position, _ in _padded(entries, ranks)[len(entries) :]]
    weights = [workload(lengths[position]) for position, _ in entries]
    order = [place for part in balanced_partitions(weights, ranks) for place in _short_long_short(part, weights)]
    by_key: dict[Hashable, list[tuple[int, bool]]] = {}
    for place in order:
        position, copy = entries[place]
        by_key.setdefault(keys[position], []).append((position, copy))
    per_rank = mini_batch_size // ranks
    steps = []
    for key, places in by_key.items():
        places = places + [(position, True) for position, _ in _padded(places, ranks)[len(places) :]]
        share = len(places) // ranks
        for k in range(math.ceil(share / per_rank)):
            cut = slice(k * per_rank, min((k + 1) * per_rank, share))
            rows = [p for rank in range(ranks) for p, copy in places[rank * share :][cut] if not copy]
            steps.append((key, rows))
    return steps
