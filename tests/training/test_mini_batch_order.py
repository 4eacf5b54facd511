"""Which samples each optimizer step of `update_schedule="mini_batches"` takes: `mini_batch_order="reference"` against
the reference's update (verl's `_balance_batch` of the whole batch, then rLLM's split per role, then each rank's
contiguous mini-batches), computed by `reference_rules.verl_update_mini_batches` from its own restatement of verl's
algorithm; `"episodes"` keeps the episode order."""

from __future__ import annotations

import threading

import pytest
import torch
from reference_rules import verl_update_mini_batches
from scripted import addition_dataset
from tiny import tiny_trainer

from trl_multiagent import Voting
from trl_multiagent.training import mini_batches
from trl_multiagent.training.batch import TrainingBatch
from trl_multiagent.training.mini_batches import mini_batch_plan

# One Voting batch of 4 episodes (3 voters, then the aggregator): each sample's prompt and completion tokens.
PROMPTS = [6, 6, 6, 4] * 4
COMPLETIONS = [3, 14, 7, 2, 11, 4, 12, 1, 5, 13, 8, 3, 9, 2, 10, 6]
ADAPTERS = ["generator", "generator", "generator", "aggregator"] * 4
EPISODES = [e for e in range(4) for _ in range(4)]


def fixed_batch(rows: list[int]) -> TrainingBatch:
    """The samples ``rows`` of the batch above, each marked by its position as its first completion token."""
    n, width_p, width_c = len(rows), max(PROMPTS), max(COMPLETIONS)
    prompt_mask = torch.tensor([[0] * (width_p - PROMPTS[r]) + [1] * PROMPTS[r] for r in rows])
    completion_mask = torch.tensor([[1] * COMPLETIONS[r] + [0] * (width_c - COMPLETIONS[r]) for r in rows])
    completion_ids = torch.full((n, width_c), 7)
    completion_ids[:, 0] = torch.tensor(rows)
    return TrainingBatch(
        prompt_ids=torch.full((n, width_p), 5),
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        advantages=torch.ones(n),
        roles=[ADAPTERS[r] for r in rows],
        adapters=[ADAPTERS[r] for r in rows],
        instances=torch.zeros(n, dtype=torch.long),
        episode_ids=torch.tensor([EPISODES[r] for r in rows]),
        truncated=torch.zeros(n, dtype=torch.bool),
        sample_weights=torch.ones(n),
        num_items_in_batch=completion_mask.sum().float(),
        num_samples_in_batch=torch.tensor(float(n)),
    )


def steps_of(plan) -> list[tuple[str, list[int]]]:
    """(adapter, the positions it trains on) per step; a zero-weight stand-in trains on nothing."""
    return [
        (adapter, part.completion_ids[part.sample_weights != 0, 0].tolist() if part.sample_weights.any() else [])
        for adapter, part in plan
    ]


def plan_one_process(order: str, mini_batch_size: int):
    batch = fixed_batch(list(range(16)))
    return mini_batch_plan(
        batch,
        ["generator", "aggregator"],
        mini_batch_size=mini_batch_size,
        num_processes=1,
        sum_over_processes=lambda t: t,
        loss_type="grpo",
        accumulation_steps=1,
        order=order,
        gather_object=list,
    )


def test_one_process_takes_verls_mini_batches_on_a_fixed_batch():
    """verl lays the whole batch out short-long-short by tokens, rLLM splits it per role in that order (the
    aggregator first: it holds the shortest sample) and the actor cuts 4-sample mini-batches: the generator's middle
    one holds its long samples (lengths 16-20 of 9-20), its first and last the shorter ones."""
    lengths = [p + c for p, c in zip(PROMPTS, COMPLETIONS)]
    expected = verl_update_mini_batches(lengths, ADAPTERS, mini_batch=4, gpus=1)
    ours = steps_of(plan_one_process("reference", 4))
    assert ours == expected
    assert [adapter for adapter, _ in ours] == ["aggregator"] + ["generator"] * 3
    first, middle, last = ([lengths[i] for i in rows] for _, rows in ours[1:])
    assert min(middle) > max(last) and sum(middle) > sum(first) > sum(last)
    # Episode order, adapters in role order: other mini-batches (the switch changes the update).
    episodes = steps_of(plan_one_process("episodes", 4))
    assert episodes == [
        ("generator", [0, 1, 2, 4]),
        ("generator", [5, 6, 8, 9]),
        ("generator", [10, 12, 13, 14]),
        ("aggregator", [3, 7, 11, 15]),
    ]


class FakeProcesses:
    """Collectives between threads standing for processes: every thread hands in its value, all get the result."""

    def __init__(self, count: int):
        self.count, self.values = count, [None] * count
        self.barrier = threading.Barrier(count)

    def collective(self, rank: int, value, combine):
        self.values[rank] = value
        self.barrier.wait()
        result = combine(list(self.values))
        self.barrier.wait()
        return result


@pytest.mark.parametrize("episodes_per_process", [[2, 2], [2, 1]])
def test_two_processes_take_verls_mini_batches_of_two_ranks(episodes_per_process):
    """Process 0 holds the first episodes, process 1 the next (consecutive, as TRL hands them out): together they
    take the steps verl takes on two ranks (each rank's contiguous share, every step its k-th cut), with the
    padding copies verl adds (an odd number of samples: three episodes) left out."""
    bounds = [0, 4 * episodes_per_process[0], 4 * sum(episodes_per_process)]
    processes, plans = FakeProcesses(2), [None, None]

    def run(rank: int) -> None:
        plans[rank] = mini_batch_plan(
            fixed_batch(list(range(bounds[rank], bounds[rank + 1]))),
            ["generator", "aggregator"],
            mini_batch_size=4,
            num_processes=2,
            sum_over_processes=lambda t: processes.collective(rank, t, sum),
            loss_type="grpo",
            accumulation_steps=1,
            order="reference",
            gather_object=lambda items: processes.collective(rank, items, lambda v: [x for part in v for x in part]),
        )

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first, second = steps_of(plans[0]), steps_of(plans[1])
    assert [a for a, _ in first] == [a for a, _ in second]  # the same steps, adapter by adapter, on both
    together = [(adapter, sorted(a + b)) for (adapter, a), (_, b) in zip(first, second)]
    n = bounds[-1]
    lengths = [p + c for p, c in zip(PROMPTS[:n], COMPLETIONS[:n])]
    expected = verl_update_mini_batches(lengths, ADAPTERS[:n], mini_batch=4, gpus=2)
    assert together == [(adapter, sorted(rows)) for adapter, rows in expected]


def test_trainer_cuts_the_reference_mini_batches_of_its_batch(tiny_model_dir, tmp_path, monkeypatch):
    """Through the trainer: isolated Voting, 8 episodes of lengths that vary, mini-batches of 2 prompts x 4; the
    rows each optimizer step trains on are verl's for the batch the trainer built, and the steps are counted per
    adapter as they were taken."""
    recorded = []
    cut = mini_batches._reference_chunks

    def recording(batch, *args):
        chunks = cut(batch, *args)
        recorded.append((batch, chunks))
        return chunks

    monkeypatch.setattr(mini_batches, "_reference_chunks", recording)

    def varied(requests, rng):
        return [f"\\boxed{{{rng.randint(2, 5)}}}" + " so" * rng.randint(0, 6) for _ in requests]

    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        dataset=addition_dataset(8),
        respond=varied,
        update_schedule="mini_batches",
        mini_batch_prompts=1,
        mini_batch_order="reference",
        per_device_train_batch_size=8,
        max_steps=1,
        policy_sharing="isolated",
        save_strategy="no",
        seed=0,
    )
    trainer.train()
    ((batch, chunks),) = recorded
    prompts, completions = batch.lengths()
    lengths = [p + c for p, c in zip(prompts, completions)]
    assert len(set(lengths)) > 4  # lengths vary: the order is the lengths', not the episodes'
    assert chunks == verl_update_mini_batches(lengths, batch.adapters, mini_batch=4, gpus=1)
    logs = trainer.state.log_history[0]
    for adapter in ("generator", "aggregator"):
        assert logs[f"adapter/{adapter}/optimizer_steps"] == sum(a == adapter for a, _ in chunks)
