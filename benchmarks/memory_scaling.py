"""Peak memory of a training step as episodes make 8x more model calls, at a fixed token budget.

    python benchmarks/memory_scaling.py
    python benchmarks/memory_scaling.py --compare-unbounded    # also the same pair without budgets
    python benchmarks/memory_scaling.py --prompts 16 --budget 4096 --completion-length 128

The paper preset bounds memory by tokens, not calls: every rollout `generate` call of the transformers backend holds
at most `rollout_max_batch_tokens` tokens of KV cache (prompts x (longest prompt + max new tokens)), and every
training forward at most `max_tokens_per_micro_batch` padded tokens. A workflow of `k` parallel calls of one role on
the problem (answers of exactly `--completion-length` tokens: `min_new_tokens`) trains one step of `--prompts` x
`--num-generations` episodes with the tiny Qwen3, the real transformers backend and the paper's update schedule, at
`k = 4` and `k = 32`, each in a fresh subprocess (glibc set to return freed buffers to the OS, so RSS tracks live
memory) that reports its peak resident set size (VmHWM). RESULT: peak RSS at 32 calls / at 4 calls, both budgets at
`--budget`. With `--compare-unbounded`, the same pair without budgets (one `generate` per tick, forwards bounded
by samples only) is printed beside it, to show what the budget holds back. The tiny model is 64 wide and 16 layers
deep so that its KV cache (8 KB a token in fp32) outweighs its compute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile

import torch
from common import child_output, prompt_rows, report, tiny_model, token_parity_reward
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, PrinterCallback

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.workflows.base import Generate, Messages, Workflow

TARGET = 1.3
CALLS = (4, 32)


class ParallelCalls(Workflow):
    """``calls`` parallel ``generator`` calls on the prompt; the first answer is the episode's."""

    roles = ("generator",)

    def __init__(self, calls: int) -> None:
        self.calls = calls

    @property
    def parallel(self) -> dict[str, int]:  # a property: a checkpoint rebuilds the workflow from `calls` alone
        return {"generator": self.calls}

    async def run(self, prompt: Messages, generate: Generate) -> str:
        answers = await asyncio.gather(*(generate("generator", prompt, instance=i) for i in range(self.calls)))
        return answers[0]


def train_one_step(args, model_dir: str, output_dir: str, calls: int, budget: int | None) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = MultiAgentGRPOTrainer(
        model=model_dir,
        workflow=ParallelCalls(calls),
        reward_funcs=token_parity_reward,
        args=MultiAgentGRPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            prompts_per_step=args.prompts,
            num_generations=args.num_generations,
            gradient_accumulation_steps=1,
            update_schedule="mini_batches",
            max_completion_length=args.completion_length,
            generation_kwargs={"min_new_tokens": args.completion_length},
            rollout_max_batch_tokens=budget,
            max_tokens_per_micro_batch=budget,
            gradient_checkpointing=False,
            max_steps=1,
            logging_steps=1,
            learning_rate=1e-5,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            training_summary=False,
            drift_alarms=False,
            seed=0,
        ),
        train_dataset=Dataset.from_list(prompt_rows(args.prompts)),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()


def peak_rss_mb(args, model_dir: str, calls: int, budget: int | None) -> float:
    """Peak RSS (MB) of a fresh process that trains one step at ``calls`` calls per episode."""
    command = [sys.executable, __file__, "--rss-child", str(calls), "--model-dir", model_dir]
    command += ["--budget", str(budget or 0)]
    for flag in ("prompts", "num_generations", "completion_length"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    # glibc otherwise keeps freed buffers in its heap by the order of allocations; serving every buffer above 64 KiB
    # from mmap makes RSS track live memory (as in sharing_cost.py).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    return float(child_output(command, env).split()[-1])


def rss_child(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        train_one_step(args, args.model_dir, tmp, args.rss_child, args.budget or None)
    # VmHWM, not ru_maxrss: getrusage keeps the parent's peak across fork + exec.
    with open("/proc/self/status") as status:
        peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(peak_kib / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--num-generations", type=int, default=2)
    parser.add_argument("--completion-length", type=int, default=64)
    parser.add_argument("--budget", type=int, default=2048, help="tokens per generate call and per forward")
    parser.add_argument("--compare-unbounded", action="store_true", help="also measure both without budgets")
    parser.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rss_child:
        return rss_child(args)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(f"{tmp}/model", args.hidden_size, args.num_layers)
        bounded = {calls: peak_rss_mb(args, model_dir, calls, args.budget) for calls in CALLS}
        unbounded = {calls: peak_rss_mb(args, model_dir, calls, None) for calls in CALLS if args.compare_unbounded}
    ratio = bounded[32] / bounded[4]
    episodes = args.prompts * args.num_generations
    rows = [
        ("model", f"tiny Qwen3 hidden={args.hidden_size} layers={args.num_layers}, LoRA r=8, transformers backend"),
        ("step", f"{episodes} episodes of 4 or 32 calls x {args.completion_length} new tokens, mini-batch schedule"),
        ("budget", f"{args.budget} tokens per generate call (rollout_max_batch_tokens) and per forward"),
        (
            "peak RSS MB, budget",
            f"4 calls {bounded[4]:.0f}, 32 calls {bounded[32]:.0f} (+{bounded[32] - bounded[4]:.0f})",
        ),
        ("peak RSS ratio, budget", f"{ratio:.3f} (32 calls / 4 calls)"),
    ]
    if unbounded:
        no_budget = (
            f"4 calls {unbounded[4]:.0f}, 32 calls {unbounded[32]:.0f} (ratio {unbounded[32] / unbounded[4]:.3f})"
        )
        rows.append(("peak RSS MB, no budget", no_budget))
    report("memory_scaling", rows, ratio, "<=", TARGET)


if __name__ == "__main__":
    main()
