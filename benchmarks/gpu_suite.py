"""A Qwen3-1.7B-shaped run on one GPU, measured against the hardware: the training phase's MFU and hardware FLOP
utilisation with what each phase ran, the 51,200-token micro-batch repeated, decoding against transformers' fastest
paths, vLLM where installed, and the shipped recipes under the single-GPU, ZeRO-2 and ZeRO-3 launch configs.

    python benchmarks/gpu_suite.py                 # one GPU, offline; the plan below, about 6 minutes on an H100
    python benchmarks/gpu_suite.py --profile       # and kernel time by group (GEMM, attention, LM head, LoRA, ...)
    python benchmarks/gpu_suite.py --cpu-smoke     # every section's code path at tiny size on CPU (what CI runs)
    python benchmarks/gpu_suite.py --sections training,decode
    python benchmarks/gpu_suite.py --digest        # the digest of this tree's sources, to match a record's

Sections, in order (the plan with each one's budget is printed first; each one's figures are written as soon as it
ends; one that fails prints its error and the others still run; the exit status is 1 if any failed):

- peak: a bf16 8192^3 matrix product, the card's measured ceiling. MFU is given against it and against the card's
  datasheet peak (dense bf16: 989 TFLOP/s for the H100 SXM and the H200; gpu_setup.DATASHEET_BF16_TFLOPS); a card
  the table does not list is named as such and gets MFU against the measured peak only.
- training: the paper's Eval-Opt math step (isolated adapters, LoRA r=64 on all linear layers, bf16, clip-high 0.28,
  sequential mini-batches per adapter clipped on their own, at most 51,200 tokens per forward) on random weights of
  Qwen3-1.7B's shape. The rollout answers every call with random words of a length drawn per role
  (drawn_lengths.py: generator 1,024-5,120 tokens, evaluator 256-1,536), so the samples have the paper's lengths
  without an hour of decoding. Step 1 (CUDA start, kernel compilation) is reported apart from the warm steps (3 by
  default: median and spread). Per warm step: its split (log-probs before the update, loss forward, backward,
  optimizer), MFU (model FLOPs: one forward and backward of each sample, model_flops.py) and hardware FLOP
  utilisation (the FLOPs the step executed, read by executed_work.py from what ran: padding, masked attention's
  full squares, recompute, extra forwards), and per phase the forwards, their shapes, real and padded tokens, the sum
  of squared sample lengths, the masks that reached attention and the attention kernel that ran, recomputed layers;
  with the LoRA weights' dtype.
- micro_batch: one micro-batch of exactly 51,200 tokens (10 samples of 1,024 prompt + 4,096 completion tokens),
  forward and backward through the trainer's loss, 5 times after a first one: time, MFU, HFU, peak memory; with
  ``--profile``, one more, profiled, and its kernel time by group.
- decode: our transformers rollout backend (two adapters mixed) against plain ``generate`` of the base model, a
  static cache with ``torch.compile``, and continuous batching (``generate_batch``), on the same requests: tokens/s,
  ours over the fastest (target >= 0.8).
- vllm (where vLLM is installed): our vLLM backend at 16 to 512 concurrent sequences, adapter sync seconds, and our
  transformers backend on the same requests.
- recipes (not in the default plan): `accelerate launch` of recipes/eval_opt_math.py with the toy preset for two
  steps under accelerate_configs/single_gpu.yaml, deepspeed_zero2.yaml and deepspeed_zero3.yaml.

Written: ``<results-dir>/gpu_suite-<date>.json`` and ``.md`` (default results-dir: benchmarks/results), with the
commit run: git's answer where the tree has its .git, else the file RUN_COMMIT at the tree's root (write it before
copying a tree without .git: ``git rev-parse HEAD > RUN_COMMIT``), and always the digest of the sources run.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from gpu_decode import decode  # noqa: E402
from gpu_setup import Sizes, datasheet_peak, significant  # noqa: E402
from gpu_training import micro_batch, training  # noqa: E402
from gpu_vllm import vllm_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("peak", "training", "micro_batch", "decode", "vllm", "recipes")
DEFAULT_SECTIONS = ("peak", "training", "micro_batch", "decode", "vllm")
RENAMED = {"memory": "micro_batch"}  # the section's name in the G1 record's command
# Seconds each section may take on an H100 at the default settings: the plan printed first. From G1's H200 record (a
# warm step of 8 episodes: 80.6 s; decoding 16 calls: 130 ms a token) scaled to this plan's sizes (3 episodes, 64 new
# tokens), with room for the first step's kernel compilation (about 40 s) and torch.compile's.
BUDGET_S = {"start": 30, "peak": 5, "training": 160, "micro_batch": 45, "decode": 120, "vllm": 0, "recipes": 150}
BUDGET_S_PROFILE = 30  # a profiled micro-batch and two profiled decode calls, and reading the profiles
BUDGET_S_WITH_VLLM = 180  # engine start, CUDA graphs, 4 concurrencies, transformers at two
PLAN_LIMIT_S = 360


def peak(sizes: Sizes, device: torch.device, **_) -> dict:
    """The card's bf16 matrix-product rate as measured here: what MFU is also given against."""
    n = sizes.matmul
    a, b = (torch.randn(n, n, device=device, dtype=sizes.dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    sync()
    began, reps = time.perf_counter(), 10
    for _ in range(reps):
        a @ b
    sync()
    tflops = 2 * n**3 * reps / (time.perf_counter() - began) / 1e12
    return {"matmul": f"{n}^3 {str(sizes.dtype).removeprefix('torch.')}", "measured_tflops": significant(tflops)}


def recipes(sizes: Sizes, device: torch.device, **_) -> dict:
    if sizes.smoke:
        return {"skipped": "CPU smoke: the recipes' DeepSpeed and single-process runs are tests/training's slow tests"}
    paper_update = ["--update_schedule", "mini_batches", "--clip_grad_norm_per_adapter", "true"]
    paper_update += ["--lr_scheduler_steps", "per_update"]
    runs = {
        "single_gpu": ("single_gpu.yaml", []),
        "zero2": ("deepspeed_zero2.yaml", paper_update),
        "zero3": ("deepspeed_zero3.yaml", paper_update),
    }
    figures = {}
    for name, (launch_config, extra) in runs.items():
        output_dir = tempfile.mkdtemp(prefix=f"gpu_suite-{name}-")
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
        command += [str(ROOT / "accelerate_configs" / launch_config), "--num_processes", "1"]
        command += [str(ROOT / "recipes" / "eval_opt_math.py"), "--config", str(ROOT / "recipes/configs/toy.yaml")]
        command += ["--use_cpu", "false", "--bf16", "true", "--max_steps", "2", "--save_steps", "2"]
        command += ["--output_dir", output_dir, "--report_to", "none", *extra]
        figures[name] = launched(command, Path(output_dir))
    return figures


def launched(command: list[str], output_dir: Path, timeout: int = 240) -> dict:
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as stopped:
        return {"rc": "timeout", "seconds": timeout, "tail": (stopped.stderr or "")[-2000:]}
    figures = {"rc": done.returncode, "seconds": round(time.perf_counter() - began, 1)}
    figures["checkpoints"] = sorted(p.name for p in output_dir.glob("checkpoint-*"))
    if done.returncode:
        figures["tail"] = (done.stderr or done.stdout)[-3000:]
        print(f"--- {command[-1]} failed (rc {done.returncode}):\n{figures['tail']}", file=sys.stderr)
    return figures


# ---------------------------------------------------------------------------------------------------- the driver
def write_results(results: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"gpu_suite-{results['date']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# gpu_suite, {results['date']}", "", f"`{results['command']}`", ""]
    lines += [f"- {key}: {value}" for key, value in results["machine"].items()]
    for section, figures in results["sections"].items():
        lines += ["", f"## {section}", "", "```", json.dumps(figures, indent=2), "```"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def machine(device: torch.device) -> dict:
    import peft
    import transformers
    import trl

    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke)"}
    info["torch"], info["transformers"] = torch.__version__, transformers.__version__
    info["trl"], info["peft"] = trl.__version__, peft.__version__
    for package in ("deepspeed", "liger_kernel", "vllm", "flash_attn"):
        if importlib.util.find_spec(package) is not None:
            info[package] = getattr(importlib.import_module(package), "__version__", "installed")
    info.update(commit_run())
    return info


def commit_run() -> dict:
    """The commit this tree is, as git says (with the files changed since) or, in a copy without .git, as the file
    RUN_COMMIT says; and the digest of the sources that ran, which settles it either way."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
        info = {"commit": head.stdout.strip(), "commit_from": "git rev-parse HEAD"}
        info["changed_since_commit"] = [line[3:] for line in changed.stdout.splitlines()]
    elif (ROOT / "RUN_COMMIT").exists():
        info = {"commit": (ROOT / "RUN_COMMIT").read_text().strip(), "commit_from": "RUN_COMMIT (no .git here)"}
    else:
        info = {"commit": "unknown: no .git and no RUN_COMMIT file in this tree", "commit_from": None}
    info["source_digest"] = source_digest()
    return info


def source_digest() -> str:
    """sha256 of the package's, the benchmarks' and the recipes' Python files (path and content), 16 hex digits."""
    digest = hashlib.sha256()
    for path in sorted(
        p for folder in ("trl_multiagent", "benchmarks", "recipes") for p in (ROOT / folder).rglob("*.py")
    ):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def plan(sections: list[str], smoke: bool, profile: bool) -> dict[str, int]:
    """Each section's budget in seconds on an H100 (the CPU smoke run has none), printed before anything runs."""
    budget = {name: BUDGET_S[name] for name in ("start", *sections)}
    for name in ("micro_batch", "decode"):
        if profile and name in budget:
            budget[name] += BUDGET_S_PROFILE // 2
    if "vllm" in budget and importlib.util.find_spec("vllm") is not None:
        budget["vllm"] = BUDGET_S_WITH_VLLM
    total = sum(budget.values())
    scale = "CPU smoke at tiny sizes; the budgets are an H100's at full size" if smoke else "on an H100"
    print(f"== plan ({scale}; limit {PLAN_LIMIT_S} s)")
    for name, seconds in budget.items():
        print(f"  {name:<12} {seconds:>4} s")
    over = f": over the limit by {total - PLAN_LIMIT_S} s" if total > PLAN_LIMIT_S else ""
    print(f"  {'total':<12} {total:>4} s{over}", flush=True)
    return budget


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: every section's code path")
    parser.add_argument(
        "--sections", default=",".join(DEFAULT_SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}"
    )
    parser.add_argument("--steps", type=int, default=4, help="training steps: the first (cold) and warm ones")
    parser.add_argument("--episodes", type=int, default=3, help="Eval-Opt episodes of the one problem of a step")
    parser.add_argument("--max-iterations", type=int, default=3, help="Eval-Opt iterations (paper: 3 math, 2 code)")
    parser.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--profile", action="store_true", help="kernel time by group of a micro-batch, and tables")
    parser.add_argument("--decode-tokens", type=int, help="new tokens per decode call (default: 64, smoke: 8)")
    parser.add_argument("--decode-rounds", type=int, help="timed rounds of each decode path (default: 3)")
    parser.add_argument(
        "--compile-backend",
        help="torch.compile backend of the static-cache decode (default: "
        "inductor; smoke: eager, which checks the path without compiling)",
    )
    parser.add_argument("--digest", action="store_true", help="print the digest of this tree's sources and exit")
    args = parser.parse_args()
    if args.digest:
        print(source_digest())
        return 0
    sections = [RENAMED.get(s, s) for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit(
            "gpu_suite.py measures a Qwen3-1.7B-shaped run on a CUDA GPU and none is visible here. To run every "
            "section's code path at tiny size on CPU: `python benchmarks/gpu_suite.py --cpu-smoke`."
        )
    budget = plan(sections, args.cpu_smoke, args.profile)
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    if args.cpu_smoke:
        torch.set_num_threads(1)
    else:
        torch.ones(1, device=device)  # CUDA's start, timed apart from every section
    started = round(time.perf_counter() - START, 2)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    results = {"date": date, "command": " ".join(["python", *sys.argv]), "machine": machine(device), "sections": {}}
    results["machine"]["python_and_cuda_start_s"] = started
    sizes = Sizes(args.cpu_smoke)
    sizes.decode_tokens = args.decode_tokens or sizes.decode_tokens
    sizes.decode_rounds = args.decode_rounds or sizes.decode_rounds
    sizes.compile_backend = args.compile_backend or sizes.compile_backend
    peaks = {"measured_tflops": peak(sizes, device)["measured_tflops"]}  # MFU is given against both
    peaks["datasheet_tflops"] = datasheet_peak(results["machine"]["device"])
    if peaks["datasheet_tflops"] is None:
        peaks["datasheet"] = (
            f"{results['machine']['device']} is not in gpu_setup.DATASHEET_BF16_TFLOPS: MFU against the measured "
            "peak only"
        )
        print(peaks["datasheet"], flush=True)
    results["peaks"] = peaks
    runs = dict(peak=peak, training=training, micro_batch=micro_batch, decode=decode, recipes=recipes)
    runs["vllm"] = vllm_section
    failed = []
    for name in sections:
        began = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            figures = runs[name](
                sizes,
                device,
                steps=args.steps,
                episodes=args.episodes,
                max_iterations=args.max_iterations,
                profile_dir=Path(args.results_dir) if args.profile else None,
                peaks=peaks,
                repeats=sizes.micro_batch_repeats,
            )
        except Exception:
            figures = {"error": traceback.format_exc()[-3000:]}
            failed.append(name)
            print(figures["error"], file=sys.stderr, flush=True)
        if "failed_paths" in figures:  # the section ran, without these parts: the run says so and exits 1
            failed.append(f"{name} ({', '.join(figures['failed_paths'])})")
        figures["section_s"] = round(time.perf_counter() - began, 1)
        if not args.cpu_smoke:
            figures["budget_s"] = budget[name]
            if figures["section_s"] > budget[name]:
                results.setdefault("over_budget", []).append(name)
        results["sections"][name] = figures
        print(json.dumps(figures, indent=2), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        stem = write_results(results, Path(args.results_dir))
    results["wall_s"] = round(time.perf_counter() - START, 1)
    stem = write_results(results, Path(args.results_dir))
    print(
        f"written: {stem}.json, {stem}.md; wall {results['wall_s']} s (planned {sum(budget.values())} s, over "
        f"budget: {results.get('over_budget', 'none')}); failed: {failed or 'none'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
