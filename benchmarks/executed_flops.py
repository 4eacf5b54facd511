"""Executed FLOPs over model FLOPs of a paper-preset training phase: what a step's forwards compute, as the model
receives them, against what the model needs.

    python benchmarks/executed_flops.py
    python benchmarks/executed_flops.py --problems 4 --episodes-per-problem 4 --accumulation 2 --mini-batch-prompts 4

A count, not a timing (no model runs): the same numbers on any machine, and the figure of record while no GPU is lent.
One step of the shipped paper preset (recipes/configs/paper_math.yaml: its batch, accumulation, mini-batches, token
bound, LoRA rank, `pad_to_multiple_of`, `activation_memory_gb`), at Qwen3-1.7B's shape (the paper's model), on one
process, of Eval-Opt calls of the paper's lengths drawn as benchmarks/padding_share.py draws them
(`trl_multiagent.testing.eval_opt_call_lengths`). The samples go through the trainer's own functions: the micro-steps
or mini-batches (`mini_batches.micro_steps`, `mini_batch_plan`, `loss_ready`), the loss forwards and the log-prob
forwards before the update (`forwards.Forwards`), which mini-batches need those (`forwards.old_logps_after_first`),
each forward's layout (`row_layout.LaidOut`) and whether it recomputes (`recompute.recomputes`).

Model FLOPs: per sample, benchmarks/model_flops.py's forward and backward (4N per token for the frozen base, the LoRA
terms, causal attention, the LM head on completion tokens). Executed, per forward as the model receives it: the linear
layers and LoRA on every token it holds, padding included; attention on the (query, key) pairs the kernel computes:
a row's whole square where a mask reaches SDPA, the causal half of a row without one, each packed sample's own causal
half under flash attention, whole 128 x 128 blocks under flex attention; the LM head on completion tokens (TRL's fused
head on a GPU); backward as model_flops.py counts it; the decoder layers once more where the forward recomputes; a
forward without backward for each log-prob forward before the update.

Before: commit ea897ce (rows end-aligned with their padding mask, TRL's `gradient_checkpointing` on every forward, the
log-probs before the update for every sample under `mini_batches`). After: this commit, with the attention SDPA (what
the preset loads), flex and flash attention. Rollout (mini-batches only): after, SDPA, with `old_logprobs="rollout"`,
the later mini-batches' log-probs before the update taken from the rollout backend, no forward for them (the preset
keeps the reference's "recompute"). RESULT: the shipped preset's update schedule (mini-batches) and `old_logprobs`, the
larger of its two policies, SDPA.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from model_flops import DecoderShape, backward_flops, forward_flops

from trl_multiagent.adapters.process_alignment import ProcessAlignment
from trl_multiagent.cli.shipped import read_preset
from trl_multiagent.testing import batch_of_lengths, eval_opt_call_lengths
from trl_multiagent.training import mini_batches
from trl_multiagent.training.forwards import Forwards, old_logps_after_first
from trl_multiagent.training.loss_weights import loss_ready
from trl_multiagent.training.recompute import ActivationShape, recomputes, tokens_that_fit
from trl_multiagent.training.row_layout import LaidOut, layout_for

PRESET = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "paper_math.yaml"
TARGET = 1.3
# Qwen3-1.7B (the paper's model): 28 layers, hidden 2048, 16 query and 8 key-value heads of 128, MLP 6144.
QWEN3_1_7B = SimpleNamespace(
    num_hidden_layers=28,
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=6144,
    vocab_size=151_936,
)
SHAPE = DecoderShape.of(QWEN3_1_7B)
FLEX_BLOCK = 128  # flex attention's block mask: a block of query x key pairs is computed whole or skipped
ATTENTIONS = ("sdpa", "flex_attention", "flash_attention_2")


@dataclass
class Tally:
    """What a step's forwards execute, at ``shape`` with LoRA adapters of ``lora_rank``."""

    shape: DecoderShape = SHAPE
    lora_rank: int = 64
    forwards: int = 0
    recomputed: int = 0
    masked: int = 0  # forwards where a mask reached attention
    held: int = 0  # tokens the forwards hold, padding included
    executed: float = 0.0
    recomputation: float = 0.0  # of which the decoder layers run again in backward
    widths: list[int] = field(default_factory=list)

    def add(self, *, rows: int, width: int, pairs: float, scored: int, masked: bool, backward: bool, recompute: bool):
        """One forward of ``rows`` x ``width`` tokens, attention on ``pairs`` (query, key) pairs, ``scored``
        completion tokens through the LM head; ``backward``: and its backward, ``recompute``: its layers twice."""
        shape, held = self.shape, rows * width
        attention = 4 * pairs * shape.heads * shape.head_dim  # scores and weighted values
        layers = shape.layers * (2 * held * (shape.layer_params() + shape.lora_params(self.lora_rank)) + attention)
        head = 2 * scored * shape.hidden * shape.vocab
        flops = layers + head
        if backward:  # the frozen base: input gradients only; LoRA: both; attention: twice its forward
            base = 2 * held * shape.layer_params()
            lora = 4 * held * shape.lora_params(self.lora_rank)
            flops += shape.layers * (base + lora + 2 * attention) + head
            flops += layers if recompute else 0.0
            self.recomputation += layers if recompute else 0.0
        self.forwards += 1
        self.recomputed += int(backward and recompute)
        self.masked += int(masked)
        self.held += held
        self.executed += flops
        self.widths.append(width)


def causal(n: int) -> float:
    return n * (n + 1) / 2


def segments(position_ids: torch.Tensor) -> list[list[int]]:
    """Each packed row's runs of position ids restarting at 0: its samples (and its padding after them)."""
    runs = []
    for row in position_ids.tolist():
        starts = [i for i, p in enumerate(row) if p == 0] + [len(row)]
        runs.append([b - a for a, b in zip(starts, starts[1:])])
    return runs


def flex_pairs(lengths: list[int]) -> float:
    """Pairs flex attention computes on one packed row: every 128 x 128 block a sample's causal mask touches."""
    blocks, start = set(), 0
    for n in lengths:
        first, last = start // FLEX_BLOCK, (start + n - 1) // FLEX_BLOCK
        blocks.update((q, k) for q in range(first, last + 1) for k in range(first, q + 1))
        start += n
    return len(blocks) * FLEX_BLOCK * FLEX_BLOCK


def add_forward(
    tally: Tally,
    part,
    *,
    version: str,
    attention: str,
    backward: bool,
    fit: int | None,
    pad_to_multiple_of: int | None = None,
) -> None:
    """One forward of ``part`` (samples of one adapter), as the model receives it: ``version`` "before" (commit
    ea897ce) or "after"; ``fit``: the most tokens a forward holds without recompute (None: every forward)."""
    input_ids, attention_mask, completion_width = part.model_inputs()
    scored = int(part.completion_mask.sum())
    own = attention_mask.sum(dim=1).tolist()
    if version == "before":  # ea897ce's end-aligned rows: as wide as the longest, the padding mask to attention
        width = max(max(own), completion_width + 1)
        masked = any(n < width for n in own)
        pairs = len(own) * (width * width if masked else causal(width))
        tally.add(
            rows=len(own), width=width, pairs=pairs, scored=scored, masked=masked, backward=backward, recompute=True
        )
        return
    layout = layout_for(attention)
    laid = LaidOut.of(
        input_ids,
        attention_mask,
        completion_width,
        layout=layout,
        pad_to_multiple_of=pad_to_multiple_of,
        row_of=[0] * len(own),  # the trainer's forwards hold one adapter's samples: one packed row
    )
    rows, width = laid.input_ids.shape
    if layout == "rows":  # no mask: SDPA's causal kernel on each row
        pairs = rows * causal(width)
    elif attention == "flex_attention":
        pairs = sum(flex_pairs(runs) for runs in segments(laid.position_ids))
    else:  # flash attention's varlen kernel: each sample's own causal half
        pairs = sum(causal(n) for runs in segments(laid.position_ids) for n in runs)
    recompute = recomputes(
        mini_batches.padded_tokens(part, packed=layout == "packed"), fit=fit, gradient_checkpointing=True
    )
    tally.add(rows=rows, width=width, pairs=pairs, scored=scored, masked=False, backward=backward, recompute=recompute)


def count_step(
    batch, args, *, schedule: str, version: str, attention: str, old_logprobs: str = "recompute"
) -> tuple[Tally, Tally]:
    """The log-prob forwards before the update and the loss forwards of one training step of ``batch``;
    ``old_logprobs="rollout"``: the rollout's log-probs in place of those forwards (none runs)."""
    logps, loss = Tally(lora_rank=args.lora_rank), Tally(lora_rank=args.lora_rank)
    padding = dict(pad_to_multiple_of=args.pad_to_multiple_of)
    layout = "rows" if version == "before" else layout_for(attention)
    fit = args.fit if version == "after" else None

    def forwards(max_tokens: int | None) -> Forwards:
        return Forwards(
            max_samples=args.batch_size,
            max_tokens=max_tokens,
            layout=layout,
            loss_type=args.loss_type,
            pad_token_id=0,
            alignment=ProcessAlignment(None),
            most_over_processes=None,
        )

    loss_bound = args.max_tokens if fit is None else min(args.max_tokens, fit)

    def logp_forwards(part) -> torch.Tensor:
        def forward(rows, adapters):
            add_forward(logps, rows, version=version, attention=attention, backward=False, fit=fit, **padding)
            return torch.zeros(rows.completion_mask.shape)

        return forwards(args.max_tokens).routed_logps(part, part.adapters, keys=part.adapters, forward=forward)

    if schedule == "mini_batches":
        plan = mini_batches.mini_batch_plan(
            batch,
            list(dict.fromkeys(batch.adapters)),
            mini_batch_size=args.mini_batch_prompts * args.episodes_per_problem,
            num_processes=1,
            sum_over_processes=lambda t: t,
            loss_type=args.loss_type,
            accumulation_steps=args.accumulation,
            order=args.mini_batch_order,
        )
        if version == "before":  # every sample's log-probs, before the plan is cut
            logp_forwards(batch)
        elif old_logprobs == "rollout":  # the rollout backend's, as each mini-batch carries them
            plan = old_logps_after_first(plan, lambda part: torch.zeros(part.completion_mask.shape))
        else:
            plan = old_logps_after_first(plan, logp_forwards)
        steps = [part for _, part in plan]
    else:
        torch.manual_seed(args.seed)
        shuffled = batch.shuffled()  # as `prepare_inputs` shuffles before it cuts the micro-steps
        cut = dict(steps=args.accumulation, loss_type=args.loss_type, num_processes=1)
        steps = mini_batches.micro_steps(shuffled, accumulation=args.accumulation, **cut)
    for step in steps:
        ready = loss_ready(step, args.loss_type)
        for part in forwards(loss_bound).loss_forwards(ready, keys=ready.adapters):
            add_forward(loss, part, version=version, attention=attention, backward=True, fit=fit, **padding)
    return logps, loss


def model_flops(batch, *, lora_rank: int, shape: DecoderShape = SHAPE) -> float:
    """Each sample trained once: its forward and backward (benchmarks/model_flops.py)."""
    prompts, completions = batch.lengths()
    total = 0.0
    for p, c in zip(prompts, completions):
        sample = dict(tokens=p + c, completion=c, lora_rank=lora_rank)
        total += forward_flops(shape, **sample) + backward_flops(shape, **sample)
    return total


def parse_args() -> argparse.Namespace:
    preset = read_preset(str(PRESET))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=preset["prompts_per_step"], help="prompts_per_step")
    parser.add_argument("--episodes-per-problem", type=int, default=preset["num_generations"])
    parser.add_argument("--accumulation", type=int, default=preset["gradient_accumulation_steps"])
    parser.add_argument("--mini-batch-prompts", type=int, default=preset["mini_batch_prompts"])
    parser.add_argument("--max-tokens", type=int, default=preset["max_tokens_per_micro_batch"])
    parser.add_argument("--activation-memory-gb", type=float, default=preset.get("activation_memory_gb"))
    parser.add_argument("--seed", type=int, default=0)
    parsed = parser.parse_args()
    episodes = parsed.problems * parsed.episodes_per_problem
    if episodes % parsed.accumulation:
        parser.error(f"{episodes} episodes do not split into --accumulation {parsed.accumulation} micro-steps.")
    parsed.batch_size = episodes // parsed.accumulation  # per_device_train_batch_size, as prompts_per_step derives it
    parsed.loss_type, parsed.lora_rank = preset["loss_type"], preset["lora_r"]
    parsed.mini_batch_order = preset["mini_batch_order"]
    parsed.pad_to_multiple_of = preset.get("pad_to_multiple_of")
    parsed.schedule = preset["update_schedule"]
    parsed.old_logprobs = preset.get("old_logprobs", "recompute")
    parsed.fit = None
    if parsed.activation_memory_gb is not None:
        activations = ActivationShape.of(QWEN3_1_7B, lora_rank=parsed.lora_rank, compute_bytes=2, lora_bytes=4)
        parsed.fit = tokens_that_fit(parsed.activation_memory_gb, activations)
    return parsed


def main() -> None:
    args = parse_args()
    episodes = args.problems * args.episodes_per_problem
    plans = eval_opt_call_lengths(episodes, seed=args.seed)
    calls = [call for plan in plans for call in plan]
    print(
        f"{episodes} Eval-Opt episodes, {len(calls)} calls, Qwen3-1.7B, LoRA r={args.lora_rank}; "
        f"per_device_train_batch_size {args.batch_size}, max_tokens_per_micro_batch {args.max_tokens}, "
        f"activation_memory_gb {args.activation_memory_gb} (forwards of at most {args.fit} tokens skip recompute)"
    )
    print(
        f"{'schedule':<13}{'policy':<10}{'version':<8}{'attention':<19}{'loss fwd':>9}{'recomp':>7}{'masked':>7}"
        f"{'logp fwd':>9}{'widest':>8}{'executed/model':>16}{'logp/model':>12}{'recompute/model':>17}"
    )
    result, rows = 0.0, []
    for schedule in ("merged", "mini_batches"):
        for policy in ("isolated", "shared"):
            batch = batch_of_lengths(plans, shared=policy == "shared")
            needed = model_flops(batch, lora_rank=args.lora_rank)
            ratios = {}
            settings = [("before", "sdpa"), *(("after", a) for a in ATTENTIONS)]
            settings += [("rollout", "sdpa")] if schedule == "mini_batches" else []  # merged: no log-prob forward
            for version, attention in settings:
                old = "rollout" if version == "rollout" else "recompute"
                counted = "after" if version == "rollout" else version
                logps, loss = count_step(
                    batch, args, schedule=schedule, version=counted, attention=attention, old_logprobs=old
                )
                ratio = (logps.executed + loss.executed) / needed
                ratios[version, attention] = ratio
                print(
                    f"{schedule:<13}{policy:<10}{version:<8}{attention:<19}{loss.forwards:>9}{loss.recomputed:>7}"
                    f"{loss.masked + logps.masked:>7}{logps.forwards:>9}{max(loss.widths + logps.widths):>8}"
                    f"{ratio:>16.3f}{logps.executed / needed:>12.3f}{loss.recomputation / needed:>17.3f}"
                )
            before, after = ratios["before", "sdpa"], ratios["after", "sdpa"]
            flex, flash = ratios["after", "flex_attention"], ratios["after", "flash_attention_2"]
            figure = f"{before:.2f} -> {after:.2f} (SDPA); flex {flex:.2f}, flash {flash:.2f}"
            if ("rollout", "sdpa") in ratios:
                figure += f"; old_logprobs=rollout {ratios['rollout', 'sdpa']:.2f}"
            rows.append((f"{schedule} {policy}", figure))
            if schedule == args.schedule:
                result = max(result, ratios["rollout" if args.old_logprobs == "rollout" else "after", "sdpa"])
    print("\n== executed_flops ==")
    for label, figure in rows + [("target", f"<= {TARGET}"), ("met", "yes" if result <= TARGET else "NO")]:
        print(f"{label:<22}  {figure}")
    print(f"RESULT executed_over_model_flops={result:.3f}", flush=True)


if __name__ == "__main__":
    main()
