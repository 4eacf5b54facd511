"""Padding in the training forwards of a paper-scale Eval-Opt step, before and after length-grouped rows.

    python benchmarks/padding_share.py
    python benchmarks/padding_share.py --problems 2 --episodes-per-problem 4 --accumulation 1   # the smallest setting

A count, not a timing (no model runs): the same numbers on any machine. One step of the paper preset
(recipes/configs/paper_math.yaml) on one process: `--problems` x `--episodes-per-problem` Eval-Opt episodes (64 x 8),
`gradient_accumulation_steps=8` micro-steps, `per_device_train_batch_size` = 64 x 8 / 8 = 64 samples at most per
forward, `max_tokens_per_micro_batch=51200`, mini-batches of 64 prompts in the reference's order; calls of the
paper's lengths (`trl_multiagent.testing.eval_opt_call_lengths`: the shared conversation, up to 3 rounds,
completions log-normal around 1,500 tokens for the generator and 175 for the evaluator, capped at 5,120). The samples
go through the trainer's own functions (`micro_steps` or, before, `generation_chunks`; `mini_batch_plan`,
`loss_ready`, `split_for_memory`, `bounded_logps`), for both update schedules and both policies, and every forward is
counted as the model receives it, in three layouts:

- **before**: commit d531c8e's grouping (rows in the order given, a forward as wide as its longest prompt plus its
  longest completion), reproduced here as `rows_in_order`, in TRL's layout (left-padded prompts, right-padded
  completions);
- **packed**: the alternative not taken: each forward one row of its samples (longest first, at most the bound's
  tokens), position ids restarting per sample; transformers gives SDPA and eager attention a block-diagonal mask;
- **after**: `mini_batches.row_groups` (longest rows first), each forward laid out as the trainer lays it out on SDPA
  (`row_layout.LaidOut`: one sample a row from its first column, no mask; the LM head on completion tokens alone).
  benchmarks/executed_flops.py counts the rest of each forward's cost (recompute, the other attention kernels).

Per setting: the forwards (the log-prob forwards before the update, which `mini_batches` needs, and the loss
forwards), the fewest the token bound allows (each adapter's own tokens over the bound, summed over micro-steps or
mini-batches), the share of padded tokens among the tokens the forwards hold, the widest forward, the LM-head
positions per completion token (TRL 1.16 on a Triton device scores the tokens of the mask it is given: exactly the
completion tokens, in TRL's layout and after), and the share of the forwards' FLOPs spent on the samples' own tokens
(`LINEAR_FLOPS` and below). RESULT:
the largest padding share after, over the settings.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from unittest import mock

import torch
from common import report

from trl_multiagent.testing import batch_of_lengths, eval_opt_call_lengths
from trl_multiagent.training import mini_batches
from trl_multiagent.training.batch import TrainingBatch
from trl_multiagent.training.loss_weights import generation_chunks, loss_ready
from trl_multiagent.training.row_layout import LaidOut

TARGET = 0.10
LOSS_TYPE = "grpo"  # the paper preset's
LAYOUTS = ("before", "packed", "after")
# Forward FLOPs at Qwen3-1.7B's shape (the paper's model): 28 layers, hidden 2048, 16 query and 8 key-value heads of
# 128, MLP 6144, vocabulary 151,936. Per token held, 2 x the layers' linear weights (the LoRA adapters' ~5% left
# out); per LM-head position, 2 x 2048 x 151,936; per (query, key) pair attention computes, 2 x 2 x 2048 per layer
# (scores and values). A forward without padding runs SDPA's causal kernel (W(W+1)/2 pairs a row of W tokens); with
# a padding or block-diagonal mask SDPA takes the mask and computes the whole square (W^2 a row).
LAYERS, HIDDEN, Q, KV, MLP, VOCAB = 28, 2048, 2048, 1024, 6144, 151_936
LINEAR_FLOPS = 2 * LAYERS * (HIDDEN * (Q + 2 * KV) + Q * HIDDEN + 3 * HIDDEN * MLP)
HEAD_FLOPS = 2 * HIDDEN * VOCAB
PAIR_FLOPS = 4 * LAYERS * Q


def rows_in_order(
    prompt_lengths, completion_lengths, *, max_samples, max_tokens, keys=None, packed=False
) -> list[list[int]]:
    """Commit d531c8e's `row_groups`: rows in the order given, each group as wide as its longest prompt plus its
    longest completion (TRL's layout), at most ``max_samples`` rows and ``max_tokens`` such tokens."""
    order = range(len(prompt_lengths))
    partitions = [list(order)] if keys is None else [[i for i in order if keys[i] == k] for k in dict.fromkeys(keys)]
    groups = []
    for rows in partitions:
        current, widest_p, widest_c = [], 0, 0
        for row in rows:
            wp, wc = max(widest_p, prompt_lengths[row]), max(widest_c, completion_lengths[row])
            fits = len(current) < max_samples and (max_tokens is None or (len(current) + 1) * (wp + wc) <= max_tokens)
            if current and not fits:
                groups.append(current)
                current, wp, wc = [], prompt_lengths[row], completion_lengths[row]
            current.append(row)
            widest_p, widest_c = wp, wc
        if current:
            groups.append(current)
    return groups


def packed_groups(
    prompt_lengths, completion_lengths, *, max_samples, max_tokens, keys=None, packed=True
) -> list[list[int]]:
    """The alternative not taken, packing: each group one row of its samples one after another (position ids
    restarting per sample), longest samples first, at most ``max_samples`` samples and ``max_tokens`` tokens."""
    lengths = [p + c for p, c in zip(prompt_lengths, completion_lengths)]
    order = range(len(lengths))
    partitions = [list(order)] if keys is None else [[i for i in order if keys[i] == k] for k in dict.fromkeys(keys)]
    groups = []
    for rows in partitions:
        current, tokens = [], 0
        for row in sorted(rows, key=lambda i: -lengths[i]):
            if current and (len(current) >= max_samples or tokens + lengths[row] > max_tokens):
                groups.append(current)
                current, tokens = [], 0
            current.append(row)
            tokens += lengths[row]
        groups.append(current)
    return groups


GROUPINGS = {"before": rows_in_order, "packed": packed_groups, "after": mini_batches.row_groups}


@dataclass
class Count:
    """What a set of forwards holds."""

    forwards: int = 0
    least: int = 0  # the fewest forwards the token bound allows
    own: int = 0  # the rows' own tokens
    held: int = 0  # tokens the forwards hold, padding included
    scored: int = 0  # LM-head positions (TRL 1.16, Triton device)
    completion: int = 0  # completion tokens
    widths: list[int] = field(default_factory=list)
    flops: float = 0.0  # the forwards' FLOPs at Qwen3-1.7B's shape
    useful: float = 0.0  # of which on the rows' own tokens: their tokens, completion positions and causal attention

    def add(self, part: TrainingBatch, layout: str) -> None:
        input_ids, attention_mask, completion_width = part.model_inputs()
        own = attention_mask.sum(dim=1).double()
        completion = int(part.completion_mask.sum())
        if layout == "after":  # one sample a row from its first column, no mask: the causal half of each row
            rows = LaidOut.of(input_ids, attention_mask, completion_width)
            width, held = rows.input_ids.size(1), rows.input_ids.numel()
            self._count(own, held, int(rows.scored.sum()), completion, width, len(own) * width * (width + 1) / 2)
            return
        if layout == "packed":  # one row; only the completion positions reach the LM head
            width, held, scored = int(own.sum()), int(own.sum()), completion
            pairs = width * width if len(own) > 1 else width * (width + 1) / 2
        else:  # TRL's log-prob computation scores the last C columns' own tokens
            width, held, scored = (
                input_ids.size(1),
                attention_mask.numel(),
                int(attention_mask[:, -completion_width:].sum()),
            )
            pairs = len(own) * (width * width if held > own.sum() else width * (width + 1) / 2)
        self._count(own, held, scored, completion, width, pairs)

    def _count(self, own: torch.Tensor, held: int, scored: int, completion: int, width: int, pairs: float) -> None:
        self.forwards += 1
        self.own += int(own.sum())
        self.held += held
        self.scored += scored
        self.completion += completion
        self.widths.append(width)
        self.flops += LINEAR_FLOPS * held + HEAD_FLOPS * scored + PAIR_FLOPS * pairs
        self.useful += LINEAR_FLOPS * float(own.sum()) + HEAD_FLOPS * completion
        self.useful += PAIR_FLOPS * float((own * (own + 1) / 2).sum())

    def bound(self, batch: TrainingBatch, max_tokens: int) -> None:
        """The fewest forwards for ``batch``'s samples: each adapter's own tokens over the bound."""
        prompts, completions = batch.lengths()
        for adapter in dict.fromkeys(batch.adapters):
            tokens = sum(p + c for p, c, a in zip(prompts, completions, batch.adapters) if a == adapter)
            self.least += math.ceil(tokens / max_tokens)


def count_step(batch: TrainingBatch, args, schedule: str, layout: str) -> tuple[Count, Count]:
    """The log-prob forwards before the update and the loss forwards of one training step of ``batch``."""
    logps, loss = Count(), Count()
    bounds = dict(max_samples=args.batch_size, max_tokens=args.max_tokens)
    with mock.patch.object(mini_batches, "row_groups", GROUPINGS[layout]):
        if schedule == "mini_batches":  # the old log-probs: every sample through its adapter, before the update

            def forward(part, adapters):
                logps.add(part, layout)
                return torch.zeros(part.completion_mask.shape)

            mini_batches.bounded_logps(batch, batch.adapters, forward=forward, keys=batch.adapters, **bounds)
            logps.bound(batch, args.max_tokens)
            plan = mini_batches.mini_batch_plan(
                batch,
                list(dict.fromkeys(batch.adapters)),
                mini_batch_size=args.mini_batch_prompts * args.episodes_per_problem,
                num_processes=1,
                sum_over_processes=lambda t: t,
                loss_type=LOSS_TYPE,
                accumulation_steps=args.accumulation,
                order="reference",
            )
            steps = [part for _, part in plan]
        else:
            torch.manual_seed(args.seed)
            shuffled = batch.shuffled()  # as `prepare_inputs` shuffles before it cuts the micro-steps
            cut = dict(steps=args.accumulation, loss_type=LOSS_TYPE, num_processes=1)
            if layout == "before":
                steps = generation_chunks(shuffled, **cut)
            else:
                steps = mini_batches.micro_steps(shuffled, accumulation=args.accumulation, **cut)
        for step in steps:
            ready = loss_ready(step, LOSS_TYPE)
            for part in mini_batches.split_for_memory(ready, loss_type=LOSS_TYPE, keys=ready.adapters, **bounds):
                loss.add(part, layout)
            loss.bound(ready, args.max_tokens)
    return logps, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=64, help="prompts_per_step")
    parser.add_argument("--episodes-per-problem", type=int, default=8, help="num_generations")
    parser.add_argument("--accumulation", type=int, default=8, help="gradient_accumulation_steps")
    parser.add_argument("--mini-batch-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=51200, help="max_tokens_per_micro_batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    episodes = args.problems * args.episodes_per_problem
    if episodes % args.accumulation:
        parser.error(f"{episodes} episodes do not split into --accumulation {args.accumulation} micro-steps.")
    args.batch_size = episodes // args.accumulation  # per_device_train_batch_size, as prompts_per_step derives it
    plans = eval_opt_call_lengths(episodes, seed=args.seed)
    calls = [call for plan in plans for call in plan]
    print(
        f"{episodes} Eval-Opt episodes, {len(calls)} calls; prompt tokens: median "
        f"{sorted(p for _, p, _ in calls)[len(calls) // 2]}, max {max(p for _, p, _ in calls)}; completion tokens: "
        f"median {sorted(c for _, _, c in calls)[len(calls) // 2]}, max {max(c for _, _, c in calls)}; "
        f"per_device_train_batch_size {args.batch_size}, max_tokens_per_micro_batch {args.max_tokens}"
    )
    header = (
        f"{'schedule':<13}{'policy':<10}{'forwards':<10}{'layout':<8}{'forwards':>9}{'fewest':>8}"
        f"{'padding':>9}{'widest':>8}{'head/completion':>17}{'useful FLOPs':>14}"
    )
    print(header)
    worst = 0.0
    rows = []
    for schedule in ("merged", "mini_batches"):
        for policy in ("isolated", "shared"):
            batch = batch_of_lengths(plans, shared=policy == "shared")
            counted = {layout: count_step(batch, args, schedule, layout) for layout in LAYOUTS}
            for k, kind in enumerate(("log-probs", "loss")):
                if not counted["after"][k].forwards:
                    continue
                for layout in LAYOUTS:
                    c = counted[layout][k]
                    print(
                        f"{schedule:<13}{policy:<10}{kind:<10}{layout:<8}{c.forwards:>9}{c.least:>8}"
                        f"{1 - c.own / c.held:>9.1%}{max(c.widths):>8}{c.scored / c.completion:>17.3f}"
                        f"{c.useful / c.flops:>14.1%}"
                    )
                before, after = counted["before"][k], counted["after"][k]
                worst = max(worst, 1 - after.own / after.held)
                rows.append(
                    (
                        f"{schedule} {policy} {kind}",
                        f"padding {1 - before.own / before.held:.1%} -> {1 - after.own / after.held:.1%}, forwards "
                        f"{before.forwards} -> {after.forwards} (fewest {after.least}), useful FLOPs "
                        f"{before.useful / before.flops:.1%} -> {after.useful / after.flops:.1%}",
                    )
                )
    report("padding_share", rows, worst, "<=", TARGET)


if __name__ == "__main__":
    main()
