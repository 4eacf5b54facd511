"""Training-step overhead of `MultiAgentGRPOTrainer` + `SingleAgent` over plain `trl.GRPOTrainer`.

    python benchmarks/step_overhead.py
    python benchmarks/step_overhead.py --hidden-size 256 --num-layers 4 --batch-size 16 --completion-length 128

Both trainers load the same tiny Qwen3 with the same LoRA config, seed, data and config, and train on identical
completions of exactly `--completion-length` tokens: plain TRL gets them from `rollout_func`, ours from a backend
that answers every call with them. So both steps do the same model work, and the difference is the multi-agent
machinery: the rollout engine, per-call records, per-sample adapter routing, weighted micro-batches, role metrics.

Runs alternate between the two trainers (A B B A ...) so drift in the shared machine's load cancels; the first
`--warmup` steps of every run are discarded. Reported: median seconds per optimizer step (rollout to optimizer,
logging included) and ours / plain, in CPU time (one thread: immune to other jobs' load) and wall time.

`--diagnose` adds a third trainer: ours with the per-sample adapter routing hooks switched off (exact here: a single
adapter, which is also PEFT's active one), to show what routing costs. `--profile` prints each trainer's cProfile
of the timed steps (one more run each: from the end of the last warm-up step to the end of the last step, the window
the timings cover; the end-of-training summary picture is outside it) and the split of their CPU time per step by
the package whose code spent it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
from collections import Counter

import torch
from common import (
    FixedBackend,
    FixedCompletions,
    alternate,
    medians,
    prompt_rows,
    report,
    tiny_model,
    token_parity_reward,
)
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, SingleAgent
from trl_multiagent.monitoring.console import RoleConsoleCallback

TARGET = 1.05


def build_trainers(args, model_dir: str, output_dir: str) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear", lora_dropout=0.0)
    settings = dict(
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.completion_length,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        learning_rate=1e-5,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    dataset = Dataset.from_list(prompt_rows(64))

    plain_completions = FixedCompletions(tokenizer, args.completion_length)

    def rollout_func(prompts, trainer):
        return {
            "prompt_ids": [plain_completions.prompt_ids(p) for p in prompts],
            "completion_ids": [plain_completions.completion_ids() for _ in prompts],
            "logprobs": None,
        }

    plain = GRPOTrainer(
        model=model_dir,
        reward_funcs=token_parity_reward,
        args=GRPOConfig(output_dir=f"{output_dir}/plain", **settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        rollout_func=rollout_func,
    )
    trainers = {"plain TRL": plain}
    for name in ["multi-agent"] + (["routing off"] if args.diagnose else []):
        trainers[name] = MultiAgentGRPOTrainer(
            model=model_dir,
            workflow=SingleAgent(template="raw"),  # the dataset prompt unchanged, as plain TRL generates
            reward_funcs=token_parity_reward,
            args=MultiAgentGRPOConfig(output_dir=f"{output_dir}/{name}", policy_sharing="shared", **settings),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            rollout_backend=FixedBackend(FixedCompletions(tokenizer, args.completion_length)),
        )
    if args.diagnose:
        # Diagnostic only: with one adapter, which is also PEFT's active one, skipping the per-sample routing hooks
        # computes the same loss; the difference in step time is the cost of routing.
        trainers["routing off"]._updates.installed.router.set = lambda names: None
    for trainer in trainers.values():
        # Printing every step's logs would time the terminal: plain TRL's printer (disable_tqdm=True), and ours, which
        # replaces it with one line per step (monitoring/console.py).
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(RoleConsoleCallback)
    return trainers


class ProfileSteps(TrainerCallback):
    """cProfile of the timed steps of one run: from the end of warm-up step ``warmup`` to the end of the last step."""

    def __init__(self, warmup: int):
        self.warmup, self.profile = warmup, cProfile.Profile()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps:
            self.profile.disable()
        elif state.global_step == self.warmup:
            self.profile.enable()


def package_of(filename: str) -> str:
    """The top-level package whose code a profiled function is: the folder under site-packages (or the standard
    library's), ``trl_multiagent`` for ours, and ``C builtins`` for functions cProfile has no file for."""
    parts = filename.replace("\\", "/").split("/")
    if filename.startswith(("~", "<")):
        return "C builtins"
    if "trl_multiagent" in parts:
        return "trl_multiagent"
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts[:-1]:
            return parts[parts.index(anchor) + 1].removesuffix(".py")
    python = next((i for i, part in enumerate(parts) if part.startswith("python3")), None)
    if python is not None and python + 1 < len(parts):
        return "stdlib " + parts[python + 1].removesuffix(".py")
    return parts[-1]


def own_time_by_package(profile: cProfile.Profile) -> Counter:
    """CPU seconds each package's own code (not its callees) spent in ``profile``."""
    split = Counter()
    for (filename, _, _), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        split[package_of(filename)] += own
    return split


def print_split(splits: dict[str, Counter], steps: int) -> None:
    """Milliseconds per step of each package's own code, each trainer side by side, and ours minus plain."""
    names = list(splits)
    packages = sorted(set().union(*splits.values()), key=lambda k: -max(s[k] for s in splits.values()))
    shown = [k for k in packages if max(s[k] for s in splits.values()) * 1000 / steps >= 0.1]
    print(f"\n== own CPU ms per step by package ({steps} steps each, under cProfile) ==")
    print(f"{'package':<22}" + "".join(f"{n:>14}" for n in names) + f"{'ours - plain':>14}")
    for package in shown + ["total"]:
        row = [sum(s.values()) if package == "total" else s[package] for s in splits.values()]
        ms = [1000 * v / steps for v in row]
        print(f"{package:<22}" + "".join(f"{v:>14.2f}" for v in ms) + f"{ms[1] - ms[0]:>+14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8, help="completions per step (per_device_train_batch_size)")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10, help="runs per trainer, alternating")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="discarded steps at the start of every run")
    parser.add_argument("--diagnose", action="store_true", help="also time ours with per-sample routing off")
    parser.add_argument("--profile", action="store_true", help="print where each trainer's time goes (cProfile)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(f"{tmp}/model", args.hidden_size, args.num_layers)
        trainers = build_trainers(args, model_dir, tmp)
        times = alternate(trainers, args.rounds, args.warmup)
        if args.profile:
            splits = {}
            for name, trainer in trainers.items():
                print(f"\n== cProfile: the {args.steps} timed steps of one more run of {name}, by own time ==")
                profiler = ProfileSteps(args.warmup)
                trainer.add_callback(profiler)
                trainer.train()
                trainer.remove_callback(profiler)
                pstats.Stats(profiler.profile).sort_stats("tottime").print_stats(12)
                splits[name] = own_time_by_package(profiler.profile)
            print_split({name: splits[name] for name in ("plain TRL", "multi-agent")}, args.steps)

    (plain_wall, plain), (ours_wall, ours) = medians(times["plain TRL"]), medians(times["multi-agent"])
    ratio = ours / plain
    rows = [
        ("model", f"tiny Qwen3 hidden={args.hidden_size} layers={args.num_layers}, LoRA r={args.lora_r}"),
        ("step", f"{args.batch_size} completions x {args.completion_length} tokens"),
        ("timed steps", f"{len(times['plain TRL'])} per trainer ({args.rounds} alternating runs)"),
        ("plain TRL s/step", f"{plain:.4f} CPU ({plain_wall:.4f} wall)"),
        ("multi-agent s/step", f"{ours:.4f} CPU ({ours_wall:.4f} wall)"),
        ("ratio (ours/plain)", f"{ratio:.3f} CPU ({ours_wall / plain_wall:.3f} wall)"),
    ]
    if args.diagnose:
        off_wall, off = medians(times["routing off"])
        rows.insert(-1, ("routing off s/step", f"{off:.4f} CPU ({off_wall:.4f} wall); ratio {off / plain:.3f}"))
    report("step_overhead", rows, ratio, "<=", TARGET)


if __name__ == "__main__":
    main()
