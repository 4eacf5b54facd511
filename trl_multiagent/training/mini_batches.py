"""Cutting a training batch into optimizer steps (mini-batches) and memory-bounded forwards (micro-batches).

Two independent cuts:

- **micro-batches** bound memory: at most ``max_samples`` samples and ``max_tokens`` padded tokens per forward,
  with weights that make the accumulated gradient exactly that of one pass over the whole set; rows are grouped by
  length within an optimizer step and laid out without a mask in each forward (row_layout.py), so forwards carry
  little padding;
- **mini-batches** (``update_schedule="mini_batches"``, the research stack's PPO update): each adapter's samples are
  cut into mini-batches of ``mini_batch_size`` samples (over all processes); each is one optimizer step. Every
  mini-batch's loss is normalised by ``max(its size, mini_batch_size)``, so a short last mini-batch is scaled by its
  size over the full size, as the reference does. ``MINI_BATCH_ORDERS``: ``"episodes"`` cuts each adapter's samples
  in episode order, adapters in the order given; ``"reference"`` cuts them as the reference stack does, after verl
  has reordered the whole batch by length (``batch_order.py``), adapters in the order they first appear there.

Every process must take the same number of optimizer steps and the same number of synchronised backward passes:
mini-batch counts come from the totals over processes, and a process with no sample in a mini-batch trains on one
zero-weight sample instead, which moves nothing but keeps the processes in step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch

from .batch import TrainingBatch
from .batch_order import reference_mini_batches
from .loss_weights import chunk_correction, generation_chunks, split_sizes

SumOverProcesses = Callable[[torch.Tensor], torch.Tensor]
MINI_BATCH_ORDERS = ("episodes", "reference")


def padded_tokens(batch: TrainingBatch, *, packed: bool = False) -> int:
    """Tokens one forward of ``batch`` processes, padding included (what memory grows with): one sample a row, each
    row as wide as the longest (row_layout.py); ``packed``: the samples' own tokens, one after another."""
    prompts, completions = batch.lengths()
    if packed:
        return sum(p + c for p, c in zip(prompts, completions))
    return len(batch) * max(p + c for p, c in zip(prompts, completions))


def row_groups(
    prompt_lengths: Sequence[int],
    completion_lengths: Sequence[int],
    *,
    max_samples: int,
    max_tokens: int | None,
    keys: Sequence[str] | None = None,
    packed: bool = False,
) -> list[list[int]]:
    """Groups of rows, one forward each: at most ``max_samples`` rows and at most ``max_tokens`` tokens, one sample a
    row as wide as the longest of them (row_layout.py), or, ``packed``, the samples' own tokens in one row (a row
    longer than that on its own forms its own group). Rows are taken longest first, so each group holds rows of
    similar lengths and pads little. With ``keys`` (e.g. each row's adapter), a group holds rows of one key only,
    keys in the order they first appear.

    Regrouping moves no sample to another optimizer step: the rows given are those of one micro-step (or of the
    log-prob forwards before the update), and the forwards' losses add up to theirs whatever the grouping."""
    lengths = [p + c for p, c in zip(prompt_lengths, completion_lengths)]
    order = range(len(lengths))
    partitions = [list(order)] if keys is None else [[i for i in order if keys[i] == k] for k in dict.fromkeys(keys)]
    groups: list[list[int]] = []
    for rows in partitions:
        current: list[int] = []
        held = 0  # tokens of the group's forward
        for row in sorted(rows, key=lambda i: -lengths[i]):  # stable: equal lengths keep their order
            width = lengths[current[0]] if current else lengths[row]  # the group's first row is its longest
            more = held + lengths[row] if packed else (len(current) + 1) * width
            full = len(current) >= max_samples or (max_tokens is not None and more > max_tokens)
            if current and full:
                groups.append(current)
                current, more = [], lengths[row]
            current.append(row)
            held = more
        if current:
            groups.append(current)
    return groups


def micro_steps(
    batch: TrainingBatch, *, steps: int, accumulation: int, loss_type: str, num_processes: int
) -> list[TrainingBatch]:
    """The ``steps`` micro-steps of a generation batch (``batch``, shuffled), cut and weighted by
    `generation_chunks`, after the rows of each optimizer step's micro-steps are sorted longest first: each
    micro-step then holds rows of similar lengths, which `row_groups` forms into full forwards with little padding.

    An optimizer step takes ``accumulation`` micro-steps, so each run of gcd(``steps``, ``accumulation``)
    micro-steps of a generation batch lies within one optimizer step (TRL's loop, and the Trainer's, count both from
    the same start): rows move only within such a run, so every optimizer step trains the samples it trained before,
    with the same weights (`generation_chunks` weighs each sample for its micro-step)."""
    run = math.gcd(steps, accumulation)
    sizes = split_sizes(len(batch), steps)
    lengths = [p + c for p, c in zip(*batch.lengths())]
    order, begin = [], 0
    for first in range(0, steps, run):
        end = begin + sum(sizes[first : first + run])
        order += sorted(range(begin, end), key=lambda row: -lengths[row])
        begin = end
    return generation_chunks(batch.select(order), steps=steps, loss_type=loss_type, num_processes=num_processes)


def bounded_logps(
    batch: TrainingBatch,
    adapters: Sequence[str],
    *,
    max_samples: int,
    max_tokens: int | None,
    forward: Callable[[TrainingBatch, list[str]], torch.Tensor],
    keys: Sequence[str] | None = None,
    same_order: Callable[[list[list[int]]], list[list[int] | str]] | None = None,
    stand_in: Callable[[str], tuple[TrainingBatch, list[str]]] | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """`[N, C]` log-probs of ``batch``, ``forward(part, its adapters)`` run on memory-bounded parts (with ``keys``,
    one per sample, each part holds samples of one key: of one adapter, or of one base model). With ``same_order``
    (several processes under DeepSpeed, where ZeRO-3 gathers a forward's parameters from every process) the groups
    of rows go in the order it gives, alike on every process; a key in place of a group is a forward of
    ``stand_in(key)`` whose output is unused."""
    logps = torch.zeros_like(batch.completion_mask, dtype=torch.float32)
    groups = row_groups(*batch.lengths(), max_samples=max_samples, max_tokens=max_tokens, keys=keys, packed=packed)
    for rows in groups if same_order is None else same_order(groups):
        if isinstance(rows, str):  # a stand-in forward of that key
            forward(*stand_in(rows))
            continue
        part = forward(batch.select(rows).trimmed(), [adapters[i] for i in rows])
        logps[rows, : part.size(1)] = part.float()
    return logps


def split_for_memory(
    batch: TrainingBatch,
    *,
    max_samples: int,
    max_tokens: int | None,
    loss_type: str,
    keys: Sequence[str] | None = None,
    packed: bool = False,
) -> list[TrainingBatch]:
    """``batch`` (one micro-step's samples, loss-ready) cut into bounded forwards whose accumulated loss equals the
    loss of ``batch``: each one's weights are corrected by its share of the samples (or tokens) of ``batch``. With
    ``keys`` (one per sample: its adapter, or its base model) each forward holds samples of one key; ``packed``:
    the forwards' samples are packed into one row (`row_groups`)."""
    groups = row_groups(*batch.lengths(), max_samples=max_samples, max_tokens=max_tokens, keys=keys, packed=packed)
    if len(groups) == 1:
        return [batch]
    tokens = batch.completion_mask.sum(dim=1).float()
    total_tokens = tokens.sum().item()
    parts = []
    for rows in groups:
        part = batch.select(rows).trimmed()
        factor = chunk_correction(
            loss_type,
            chunk_samples=len(rows),
            chunk_tokens=tokens[rows].sum().item(),
            global_samples=len(batch),
            global_tokens=total_tokens,
            num_processes=1,
            steps_per_generation=1,
        )
        parts.append(replace(part, advantages=part.advantages * factor, sample_weights=part.sample_weights * factor))
    return parts


def mini_batch_plan(
    batch: TrainingBatch,
    adapters: Sequence[str],
    *,
    mini_batch_size: int,
    num_processes: int,
    sum_over_processes: SumOverProcesses,
    loss_type: str,
    accumulation_steps: int,
    order: str = "episodes",
    gather_object: Callable[[list], list] | None = None,
) -> list[tuple[str, TrainingBatch]]:
    """The mini-batches of every adapter in turn, each as (adapter, its samples here) with weights set so that TRL's
    loss over it, divided by ``accumulation_steps`` as TRL divides, is its mean over ``max(global size,
    mini_batch_size)`` samples (tokens, for token-level loss types). The number of mini-batches of an adapter is the
    same on every process, and a process with no sample in one trains on one zero-weight sample instead.

    ``batch`` is in episode order. ``order="episodes"``: adapters in ``adapters`` order, each process cutting its own
    samples of an adapter into chunks of ``ceil(mini_batch_size / num_processes)``. ``order="reference"``: the
    reference stack's mini-batches over the samples of every process (``batch_order.reference_mini_batches``, with
    one rank per process), which ``gather_object`` (accelerate's) collects.
    """
    if order == "reference":
        chunks = _reference_chunks(batch, mini_batch_size, num_processes, gather_object)
    elif order == "episodes":
        chunks = _episode_chunks(batch, adapters, mini_batch_size, num_processes, sum_over_processes)
    else:
        raise ValueError(f"`mini_batch_order` must be one of {MINI_BATCH_ORDERS}, got {order!r}.")
    tokens = batch.completion_mask.sum(dim=1).float()
    counts = torch.tensor([[len(r), float(tokens[r].sum()) if r else 0.0] for _, r in chunks]).view(-1, 2)
    counts = sum_over_processes(counts.to(batch.advantages.device)).tolist()
    plan = []
    for (adapter, rows), (samples, chunk_tokens) in zip(chunks, counts):
        scale = max(1.0, mini_batch_size / samples) if samples else 1.0  # short mini-batch: size / full size
        part = batch.select(rows) if rows else _stand_in(batch, adapter)
        factor = chunk_correction(
            loss_type,
            chunk_samples=len(part),
            chunk_tokens=part.completion_mask.sum().item(),
            global_samples=samples * scale,
            global_tokens=chunk_tokens * scale,
            num_processes=num_processes,
            steps_per_generation=accumulation_steps,
        )
        if not rows:
            factor = 0.0  # the stand-in: no policy term, no KL term, whatever the loss type
        num_items = torch.tensor(chunk_tokens * scale, device=batch.advantages.device)
        plan.append(
            (adapter, replace(part, sample_weights=part.sample_weights * factor, num_items_in_batch=num_items))
        )
    return plan


def _episode_chunks(batch, adapters, mini_batch_size, num_processes, sum_over_processes) -> list[tuple[str, list]]:
    local = torch.tensor([float(a == name) for name in adapters for a in batch.adapters]).view(len(adapters), -1)
    totals = sum_over_processes(local.sum(dim=1).to(batch.advantages.device)).tolist()
    per_process = math.ceil(mini_batch_size / num_processes)
    chunks: list[tuple[str, list[int]]] = []
    for adapter, total in zip(adapters, totals):
        rows = [i for i, a in enumerate(batch.adapters) if a == adapter]
        steps = math.ceil(total / mini_batch_size)
        for k in range(steps):
            end = (k + 1) * per_process if k < steps - 1 else len(rows)
            chunks.append((adapter, rows[k * per_process : end]))
    return chunks


def _reference_chunks(batch, mini_batch_size, num_processes, gather_object) -> list[tuple[str, list]]:
    """This process's rows of each of the reference's mini-batches. A sample is known everywhere by its episode and
    its place among the episode's calls; sorted so, the samples of every process are the batch in the reference's
    order before balancing (processes hold consecutive episodes, each episode its calls in the order made)."""
    if gather_object is None and num_processes > 1:
        raise ValueError("The reference's mini-batches span every process: pass `gather_object`.")
    episodes = batch.episode_ids.tolist()
    places = [j for _, calls in itertools.groupby(episodes) for j, _ in enumerate(calls)]
    prompts, completions = batch.lengths()  # verl's attention mask: prompt and completion tokens
    local = [((e, j), p + c, a) for e, j, p, c, a in zip(episodes, places, prompts, completions, batch.adapters)]
    everyone = sorted(local if gather_object is None else gather_object(local))
    row_of = {key: row for row, (key, _, _) in enumerate(local)}
    rows_here = [row_of.get(key) for key, _, _ in everyone]
    steps = reference_mini_batches(
        [length for _, length, _ in everyone],
        [adapter for _, _, adapter in everyone],
        mini_batch_size=mini_batch_size,
        ranks=num_processes,
    )
    return [(adapter, [rows_here[g] for g in positions if rows_here[g] is not None]) for adapter, positions in steps]


def _stand_in(batch: TrainingBatch, adapter: str) -> TrainingBatch:
    """One sample routed to ``adapter`` that trains nothing (its weight becomes 0)."""
    one = batch.select([0])
    return replace(one, adapters=[adapter])


def check_schedule(args, deepspeed: bool, deepspeed_config: Mapping | None = None) -> None:
    """The update schedule's settings under DeepSpeed (``deepspeed_config``: its config, where known). The engine
    takes each mini-batch's optimizer step through the optimizer the Trainer builds, one param group per adapter
    (adapters/deepspeed_groups.py), and the Trainer's scheduler steps as ``lr_scheduler_steps`` says: an ``optimizer``
    or ``scheduler`` section of the config, which puts DeepSpeed's own in their place, and a partial optimizer
    offload, which steps part of the parameters with an optimizer ZeRO-3 builds itself, are refused where they would
    step other than without DeepSpeed."""
    if not deepspeed or deepspeed_config is None:
        return
    mini_batches = args.update_schedule == "mini_batches"
    per_adapter = mini_batches or args.clip_grad_norm_per_adapter
    offload = deepspeed_config.get("zero_optimization", {}).get("offload_optimizer") or {}
    if per_adapter and float(offload.get("ratio", 1.0)) != 1.0:
        raise ValueError(
            f"The DeepSpeed config's zero_optimization.offload_optimizer.ratio={offload['ratio']} steps part of the "
            "parameters with an AdamW that ZeRO-3 builds itself, over every adapter, which cannot step an adapter "
            "alone (update_schedule='mini_batches') nor clip each on its own (clip_grad_norm_per_adapter). Set the "
            "ratio to 1 (offload all of the optimizer) or leave it out."
        )
    if "optimizer" in deepspeed_config and per_adapter:
        raise ValueError(
            "The DeepSpeed config's `optimizer` section makes DeepSpeed build its own optimizer, one group over every "
            "adapter, which cannot step an adapter alone (update_schedule='mini_batches') nor clip each on its own "
            "(clip_grad_norm_per_adapter). Remove that section: the Trainer's optimizer (`optim`, `learning_rate`, "
            "`weight_decay`, `adam_beta1`/`adam_beta2`/`adam_epsilon`) takes its place."
        )
    if "scheduler" in deepspeed_config and (mini_batches or args.lr_scheduler_steps == "per_update"):
        raise ValueError(
            "The DeepSpeed config's `scheduler` section makes the engine step its own schedule once per optimizer "
            "step, which is once per mini-batch under update_schedule='mini_batches', and never per adapter update "
            "call (lr_scheduler_steps='per_update'). Remove that section: the Trainer's scheduler "
            "(`lr_scheduler_type`, `warmup_steps`) takes its place."
        )
