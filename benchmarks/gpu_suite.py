"""A Qwen3-1.7B-shaped run on one GPU, measured against the hardware: first and warm steps, MFU, decode, memory, and
the shipped recipes under the single-GPU, ZeRO-2 and ZeRO-3 launch configs.

    python benchmarks/gpu_suite.py                 # one GPU, offline, no vLLM needed; about 5 minutes on an H200
    python benchmarks/gpu_suite.py --cpu-smoke     # every section's code path at tiny size on CPU (what CI runs)
    python benchmarks/gpu_suite.py --sections training,decode

Sections, in order (each one's figures are written as soon as it ends; one that fails prints its error and the
others still run; the exit status is 1 if any failed):

- peak: a bf16 8192^3 matrix product, the card's measured ceiling (next to the datasheet's 989 TFLOP/s dense bf16).
- training: the paper's Eval-Opt math step (isolated adapters, LoRA r=64 on all linear layers, bf16, clip-high 0.28,
  sequential mini-batches per adapter clipped on their own, at most 51,200 tokens per forward, gradient
  checkpointing) on random weights of Qwen3-1.7B's shape. The rollout answers every call with random words of a
  length drawn per role (drawn_lengths.py: generator 1,024-5,120 tokens, evaluator 256-1,536), so the samples have
  the paper's lengths without an hour of decoding; their prompts grow as the conversation quotes them (up to ~13k
  tokens). Step 1 (CUDA start, kernel compilation) is reported apart from the warm steps; each warm step is split
  into the log-prob forward before the update, the loss forward, backward, optimizer and the rest; MFU is the
  model FLOPs of the training phase (model_flops.py: frozen base, no weight gradients) over its time and the peak.
- memory: one micro-batch of exactly 51,200 tokens (10 samples of 1,024 prompt + 4,096 completion tokens), forward
  and backward through the trainer's loss: peak memory and its time.
- decode: our transformers rollout backend against plain transformers ``generate`` on the same PEFT model and the
  same requests (16 calls, two adapters mixed, 400-token prompts, 128 new tokens, sampled at 0.7): ms per decoding
  step each, alternated, and their ratio (plain / ours; 1.0 = no overhead).
- recipes: `accelerate launch` of recipes/eval_opt_math.py with the toy preset for two steps under
  accelerate_configs/single_gpu.yaml, deepspeed_zero2.yaml and deepspeed_zero3.yaml (one process each; the ZeRO ones
  with the paper's update: mini-batches per adapter, per-adapter clipping, the per-update scheduler).
- vllm: two steps of the toy recipe with colocated vLLM, when vLLM is installed (skipped otherwise).

Written: ``<results-dir>/gpu_suite-<date>.json`` and ``.md`` (default results-dir: benchmarks/results).
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from gpu_decode import decode  # noqa: E402
from gpu_setup import Sizes, significant  # noqa: E402
from gpu_training import memory, training  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("peak", "training", "memory", "decode", "recipes", "vllm")


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


def vllm(sizes: Sizes, device: torch.device, **_) -> dict:
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    if sizes.smoke:
        return {"skipped": "CPU smoke: the vLLM backend's tests run in CI's vLLM venv"}
    output_dir = tempfile.mkdtemp(prefix="gpu_suite-vllm-")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    command += [str(ROOT / "accelerate_configs/single_gpu.yaml"), "--num_processes", "1"]
    command += [str(ROOT / "recipes/eval_opt_math.py"), "--config", str(ROOT / "recipes/configs/toy.yaml")]
    command += ["--use_cpu", "false", "--bf16", "true", "--max_steps", "2", "--save_steps", "2"]
    command += ["--rollout_backend", "vllm", "--output_dir", output_dir, "--report_to", "none"]
    return {"colocated": launched(command, Path(output_dir))}


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
    if importlib.util.find_spec("deepspeed") is not None:
        import deepspeed

        info["deepspeed"] = deepspeed.__version__
    info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    info["commit"] = info["commit"].stdout.strip() or "unknown"
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: every section's code path")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--steps", type=int, default=3, help="training steps: the first (cold) and warm ones")
    parser.add_argument("--episodes", type=int, default=8, help="Eval-Opt episodes of the one problem of a step")
    parser.add_argument("--max-iterations", type=int, default=3, help="Eval-Opt iterations (paper: 3 math, 2 code)")
    parser.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--profile", action="store_true", help="kernel tables of a micro-batch and a decode call")
    parser.add_argument("--decode-tokens", type=int, help="new tokens per decode call (default: 128, smoke: 8)")
    args = parser.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit(
            "gpu_suite.py measures a Qwen3-1.7B-shaped run on a CUDA GPU and none is visible here. To run every "
            "section's code path at tiny size on CPU: `python benchmarks/gpu_suite.py --cpu-smoke`."
        )
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
    runs = dict(peak=peak, training=training, memory=memory, decode=decode, recipes=recipes, vllm=vllm)
    measured = peak(sizes, device)["measured_tflops"]  # training's MFU is also given against it
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
                peak_tflops=measured,
            )
        except Exception:
            figures = {"error": traceback.format_exc()[-3000:]}
            failed.append(name)
            print(figures["error"], file=sys.stderr, flush=True)
        figures["section_s"] = round(time.perf_counter() - began, 1)
        results["sections"][name] = figures
        print(json.dumps(figures, indent=2), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        stem = write_results(results, Path(args.results_dir))
    results["wall_s"] = round(time.perf_counter() - START, 1)
    stem = write_results(results, Path(args.results_dir))
    print(f"written: {stem}.json, {stem}.md; wall {results['wall_s']} s; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
