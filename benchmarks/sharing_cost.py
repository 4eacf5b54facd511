"""Cost of isolated policies (one LoRA adapter per role) over a shared one, on the same workflow.

    python benchmarks/sharing_cost.py
    python benchmarks/sharing_cost.py --hidden-size 512 --num-layers 8 --lora-r 64 --completion-length 128
    python benchmarks/sharing_cost.py --model toy        # the shipped toy model (hidden 256, 4 layers)
    python benchmarks/sharing_cost.py --profile          # where each mode's steps spend their time
    python benchmarks/sharing_cost.py --mix-adapters-in-forward   # isolated in one mixed-adapter forward

Orch-Workers has three role types, so `policy_sharing="isolated"` trains 3 adapters on every training batch
(orchestrator, workers and synthesizer calls side by side; each forward holds one adapter's samples unless
`--mix-adapters-in-forward`), while `"shared"` trains 1. Both
trainers load the same tiny Qwen3, data and seed and train on identical fixed-length completions from a scripted
backend, so the difference is the per-role adapters alone.

Time: the two trainers alternate runs (A B B A ...) in this process; median seconds per optimizer step after
`--warmup` discarded steps per run, and isolated / shared, in CPU time (one thread: immune to other jobs' load) and
wall time. Memory: each mode trains the same steps in a fresh
subprocess (glibc set to return freed buffers to the OS, so RSS tracks live memory), which reports its peak
resident set size (VmHWM); 3 adapters vs 1 as a ratio and a difference.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import (
    FixedBackend,
    FixedCompletions,
    alternate,
    child_output,
    medians,
    prompt_rows,
    report,
    tiny_model,
    token_parity_reward,
)
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, PrinterCallback

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, OrchWorkers
from trl_multiagent.common.model_names import resolve_model_name

TARGET = 1.15
MODES = ("isolated", "shared")


def build_trainer(args, model_dir: str, output_dir: str, sharing: str) -> MultiAgentGRPOTrainer:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = MultiAgentGRPOTrainer(
        model=model_dir,
        workflow=OrchWorkers(n_workers=3, workers="fixed"),  # always 3 workers, whatever the plan parses to
        reward_funcs=token_parity_reward,
        args=MultiAgentGRPOConfig(
            output_dir=f"{output_dir}/{sharing}",
            policy_sharing=sharing,
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=args.episodes,
            num_generations=args.num_generations,
            max_completion_length=args.completion_length,
            max_steps=args.warmup + args.steps,
            logging_steps=1,
            learning_rate=1e-5,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            training_summary=False,  # its plot at the end of every run is no part of a step (6 s a run here)
            mix_adapters_in_forward=args.mix_adapters_in_forward,
            seed=0,
        ),
        train_dataset=Dataset.from_list(prompt_rows(64)),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear", lora_dropout=0.0
        ),
        rollout_backend=FixedBackend(FixedCompletions(tokenizer, args.completion_length)),
    )
    trainer.remove_callback(PrinterCallback)  # printing every step's logs would time the terminal
    return trainer


def peak_rss_mb(args, model_dir: str, sharing: str) -> tuple[float, int]:
    """Peak RSS (MB) and trainable parameter count of a fresh process that builds and trains one mode."""
    command = [sys.executable, __file__, "--rss-child", sharing, "--model-dir", model_dir]
    for flag in ("episodes", "num_generations", "completion_length", "lora_r", "steps", "warmup"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    command += ["--mix-adapters-in-forward"] if args.mix_adapters_in_forward else []
    # glibc otherwise keeps freed activation buffers in its heap, and the retained amount varies with the order of
    # allocations by 100-200 MB here; serving every buffer above 64 KiB from mmap makes RSS track live memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    output = child_output(command, env).split()
    return float(output[-2]), int(output[-1])


def rss_child(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, args.model_dir, tmp, args.rss_child)
        trainer.train()
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    # VmHWM, not ru_maxrss: getrusage keeps the parent's peak across fork + exec, so every child would report the
    # (larger) parent's.
    with open("/proc/self/status") as status:
        peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(peak_kib / 1024, trainable)


def profile(trainers: dict) -> None:
    """cProfile of one run of each trainer (after a warm-up run): total CPU seconds and the functions whose own time
    differs most between the modes."""
    import cProfile
    import pstats

    own: dict[str, dict[str, float]] = {}
    for sharing, trainer in trainers.items():
        trainer.train()  # warm-up
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        trainer.train()
        profiler.disable()
        stats = pstats.Stats(profiler).stats
        own[sharing] = {f"{Path(f).name}:{line}({name})": tt for (f, line, name), (_, _, tt, _, _) in stats.items()}
        print(f"{sharing}: {sum(own[sharing].values()):.3f} CPU s in {trainer.state.global_step} steps")
    names = set(own["isolated"]) | set(own["shared"])
    diff = sorted(names, key=lambda n: own["isolated"].get(n, 0.0) - own["shared"].get(n, 0.0), reverse=True)
    print(f"{'isolated - shared (s)':>22} {'isolated':>9} {'shared':>9}  function")
    for name in diff[:20]:
        i, s = own["isolated"].get(name, 0.0), own["shared"].get(name, 0.0)
        print(f"{i - s:>22.3f} {i:>9.3f} {s:>9.3f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=2, help="episodes per step (5 model calls each)")
    parser.add_argument("--num-generations", type=int, default=2)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="runs per trainer, alternating")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="discarded steps at the start of every run")
    parser.add_argument("--model", help="a model folder, or 'toy' (the shipped toy model), instead of a tiny one")
    parser.add_argument("--profile", action="store_true", help="print where each mode's steps spend their time")
    parser.add_argument(
        "--mix-adapters-in-forward",
        action="store_true",
        help="isolated: one forward per batch, each sample routed",
    )
    parser.add_argument("--rss-child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rss_child:
        return rss_child(args)

    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = resolve_model_name(args.model)
        else:
            model_dir = tiny_model(f"{tmp}/model", args.hidden_size, args.num_layers)
        trainers = {sharing: build_trainer(args, model_dir, tmp, sharing) for sharing in MODES}
        if args.profile:
            return profile(trainers)
        times = alternate(trainers, args.rounds, args.warmup)
        memory = {sharing: peak_rss_mb(args, model_dir, sharing) for sharing in MODES}

    (isolated_wall, isolated), (shared_wall, shared) = medians(times["isolated"]), medians(times["shared"])
    ratio = isolated / shared
    (rss_isolated, params_isolated), (rss_shared, params_shared) = memory["isolated"], memory["shared"]
    calls = 5 * args.episodes
    rows = [
        (
            "model",
            f"{args.model or f'tiny Qwen3 hidden={args.hidden_size} layers={args.num_layers}'}, LoRA r={args.lora_r}",
        ),
        ("step", f"{args.episodes} Orch-Workers episodes, {calls} calls x {args.completion_length} tokens"),
        ("isolated forwards", "one mixed forward" if args.mix_adapters_in_forward else "one per adapter"),
        ("timed steps", f"{len(times['shared'])} per trainer ({args.rounds} alternating runs)"),
        ("shared s/step (1 adapter)", f"{shared:.4f} CPU ({shared_wall:.4f} wall)"),
        ("isolated s/step (3 adapters)", f"{isolated:.4f} CPU ({isolated_wall:.4f} wall)"),
        ("trainable params", f"isolated {params_isolated:,} vs shared {params_shared:,}"),
        ("peak RSS MB", f"isolated {rss_isolated:.0f} vs shared {rss_shared:.0f} (+{rss_isolated - rss_shared:.0f})"),
        ("peak RSS ratio", f"{rss_isolated / rss_shared:.3f}"),
        ("step time ratio", f"{ratio:.3f} CPU, {isolated_wall / shared_wall:.3f} wall (isolated / shared)"),
    ]
    report("sharing_cost", rows, ratio, "<=", TARGET)


if __name__ == "__main__":
    main()
