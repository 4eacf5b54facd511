"""A long toy run stays flat: memory, file descriptors, threads, child processes and disk after warm-up.

    OMP_NUM_THREADS=1 python benchmarks/long_run.py                 # 1,000 steps or 60 minutes, whichever first
    OMP_NUM_THREADS=1 python benchmarks/long_run.py --steps 100 --minutes 15
    OMP_NUM_THREADS=1 python benchmarks/long_run.py --tiny --steps 100    # a tiny model

The slow test adds `--per_device_train_batch_size 4 --num_generations 4 --max_completion_length 8` to the last form.

The toy preset (recipes/configs/toy.yaml) trains Eval-Opt on the offline arithmetic task, as
recipes/eval_opt_math.py does, with `monitor_resources=True` (the package's `resources/*` metrics, logged every
step), a checkpoint every `--save-steps` steps and `save_total_limit` keeping the last `--save-total-limit`. The run
stops by itself at `--steps` steps or after `--minutes`, whichever comes first (on a busy machine the time does).

After warm-up (the first `--warmup` fraction of the steps reached, at least 5, and until `--save-total-limit`
checkpoints exist: the folder grows by design until then), each metric's least-squares slope
against the step is fitted, with a 95% interval from a moving-block bootstrap (blocks of two checkpoint periods, so
the sawtooth of saving and rotating checkpoints stays within a block). A metric is flat when the interval's upper
end, extrapolated over 1,000 steps, stays under its bound:

- resident memory: under 64 MB per 1,000 steps (a few % of the process; Trainer's `log_history` alone keeps every
  log line, about 6 KB a step in memory, which is growth by design and counted here; it is measured each step and
  printed apart, as `bench/log_history_mb` and `rss_less_log_history_mb`);
- open file descriptors, threads, child processes: under 10 per 1,000 steps (one leaked per step, or per checkpoint,
  exceeds it);
- the output folder, less its `trainer_state.json` files: under one checkpoint's size per 1,000 steps (a rotation
  that stopped deleting adds one per checkpoint). Each kept checkpoint's `trainer_state.json` holds every log line
  so far (Trainer's `log_history`), a few KB a step: that growth is by design, printed apart as `trainer_state_mb`.

The run's process starts with `MALLOC_MMAP_THRESHOLD_=65536` (the benchmark restarts itself with it), as
memory_scaling does: glibc then returns freed buffers to the system, so the resident memory follows live memory
instead of the heap's high-water mark, and a step's transient buffers do not hide a slow climb.

Arguments after the benchmark's own are the recipe's (e.g. `--max_completion_length 16`). The last line is
``RESULT long_run value=<x> target<1 steps=<n> flat=<yes|no> rss_mb=<u> open_fds=<u> threads=<u>
child_processes=<u> checkpoints_mb=<u>``: each ``u`` the upper end of a slope's interval per 1,000 steps, ``x`` the
largest of them as a share of its bound (flat: under 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import ModelConfig, ScriptArguments, get_peft_config  # noqa: E402

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, MultiAgentGRPOTrainer  # noqa: E402
from trl_multiagent.cli.recipe_parser import RecipeParser  # noqa: E402
from trl_multiagent.common.model_names import resolve_model_name  # noqa: E402
from trl_multiagent.tasks import get_task  # noqa: E402
from trl_multiagent.testing import build_tiny_qwen3  # noqa: E402
from trl_multiagent.workflows.options import WorkflowOptions  # noqa: E402

TOY = Path(__file__).resolve().parent.parent / "recipes" / "configs" / "toy.yaml"
PER = 1000  # slopes are quoted per this many steps
METRICS = {  # metric -> its bound per 1,000 steps (None: not judged; the folder less its logs is)
    "resources/rss_mb": 64.0,
    "resources/open_fds": 10.0,
    "resources/threads": 10.0,
    "resources/child_processes": 10.0,
    "resources/output_dir_mb": None,
}


class TrainerStateSize(TrainerCallback):
    """Adds `bench/trainer_state_mb`, the size of the output folder's trainer_state.json files, to each log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        size = sum(p.stat().st_size for p in Path(args.output_dir).glob("checkpoint-*/trainer_state.json")) / 2**20
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["bench/trainer_state_mb"] = size
        return control


def python_size(obj, seen: set[int]) -> int:
    """Bytes of ``obj`` and of the dicts, lists, keys and values it holds (``sys.getsizeof``), each object once."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(python_size(key, seen) + python_size(value, seen) for key, value in obj.items())
    elif isinstance(obj, list | tuple):
        size += sum(python_size(item, seen) for item in obj)
    return size


class LogHistorySize(TrainerCallback):
    """Adds `bench/log_history_mb`, what Trainer's `log_history` (every log line so far) holds in memory, to each
    log: growth by design, linear in steps, printed apart from the rest of the resident memory."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["bench/log_history_mb"] = python_size(state.log_history, set()) / 2**20
        return control


class StopAfter(TrainerCallback):
    """Ends training at the first step end past ``seconds`` of training."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start > self.seconds:
            control.should_training_stop = True
        return control


def slope_interval(x: np.ndarray, y: np.ndarray, block: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Least-squares slope of ``y`` on ``x`` and its 95% moving-block bootstrap interval (2,000 resamples of
    consecutive blocks of ``block`` points, which keeps the series' local correlation)."""
    slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(y) else 0.0
    n = len(x)
    block = min(block, n)
    starts = np.arange(n - block + 1)
    draws = []
    for _ in range(2000):
        picked = rng.choice(starts, size=-(-n // block))
        index = (picked[:, None] + np.arange(block)).ravel()[:n]
        xs, ys = x[index], y[index]
        draws.append(np.polyfit(xs, ys, 1)[0] if np.ptp(ys) and np.ptp(xs) else 0.0)
    low, high = np.percentile(draws, [2.5, 97.5])
    return slope, float(low), float(high)


def recipe_settings(args, recipe_argv: list[str], output_dir: str, model: str) -> tuple:
    """The recipe's settings: the toy preset, this benchmark's, then the recipe flags given."""
    parser = RecipeParser((ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions))
    return parser.parse_args_and_config(
        [
            "--config",
            str(TOY),
            "--model_name_or_path",
            model,
            "--output_dir",
            os.path.join(output_dir, "run"),
            "--max_steps",
            str(args.steps),
            "--save_steps",
            str(args.save_steps),
            "--save_total_limit",
            str(args.save_total_limit),
            "--monitor_resources",
            "true",
            "--training_summary",
            "false",
            "--disable_tqdm",
            "true",
            *recipe_argv,
        ]
    )


def train(args, recipe_argv: list[str], output_dir: str) -> MultiAgentGRPOTrainer:
    model = build_tiny_qwen3(os.path.join(output_dir, "tiny-model")) if args.tiny else "toy"
    script_args, training_args, model_args, options = recipe_settings(args, recipe_argv, output_dir, model)
    task = get_task("math")
    dataset = task.train_dataset(script_args.dataset_name, script_args.dataset_train_split, training_args.seed)
    workflow = EvalOpt(max_iterations=3, prompts=options.prompts, parsing=options.parsing, history=options.history)
    trainer = MultiAgentGRPOTrainer(
        model=resolve_model_name(model_args.model_name_or_path),
        workflow=workflow,
        reward_funcs=task.make_reward(),
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
        answer_checker=task.answer_checker,
        callbacks=[StopAfter(args.minutes * 60), TrainerStateSize(), LogHistorySize()],
    )
    trainer.train()
    return trainer


def checkpoint_mb(run_dir: Path) -> float:
    """The size of the newest checkpoint folder left in ``run_dir``."""
    newest = max(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return sum(f.stat().st_size for f in newest.rglob("*") if f.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=0.2, help="Fraction of the steps reached left out of fits.")
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--save-total-limit", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="A tiny random Qwen3 instead of the toy model.")
    parser.add_argument("--output-dir", help="Where the run's folder and resources.csv go (default: a temporary one).")
    args, recipe_argv = parser.parse_known_args()
    recipe_settings(args, recipe_argv, "unused", "toy")  # a wrong recipe flag stops here, before the restart below
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":  # set before the process starts, or glibc ignores it
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as scratch:
        output_dir = args.output_dir or scratch
        start = time.monotonic()
        trainer = train(args, recipe_argv, output_dir)
        minutes = (time.monotonic() - start) / 60
        rows = [log for log in trainer.state.log_history if "resources/rss_mb" in log and "loss" in log]
        for log in rows:  # the part save_total_limit bounds, and the logs kept in the checkpoints
            log["checkpoints_mb"] = log["resources/output_dir_mb"] - log["bench/trainer_state_mb"]
            log["rss_less_log_history_mb"] = log["resources/rss_mb"] - log["bench/log_history_mb"]
        per_checkpoint = checkpoint_mb(Path(output_dir) / "run")
        write_csv(Path(output_dir) / "resources.csv", rows)
    print(f"steps reached {int(rows[-1]['step'])} in {minutes:.1f} min; one checkpoint {per_checkpoint:.2f} MB")
    analyse(rows, args, per_checkpoint)


COLUMNS = (*METRICS, "bench/trainer_state_mb", "checkpoints_mb", "bench/log_history_mb", "rss_less_log_history_mb")


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as out:
        out.write("step," + ",".join(c.split("/")[-1] for c in COLUMNS) + "\n")
        for log in rows:
            out.write(f"{log['step']}," + ",".join(f"{log[c]:.4f}" for c in COLUMNS) + "\n")


def analyse(rows: list[dict], args, per_checkpoint: float) -> None:
    steps = np.array([log["step"] for log in rows], dtype=float)
    warm = max(5, args.warmup * steps[-1], args.save_steps * args.save_total_limit + 1)
    kept = steps >= warm
    rng = np.random.default_rng(0)
    block = 2 * args.save_steps
    print(f"fitted on steps {int(steps[kept][0])}-{int(steps[-1])} ({int(kept.sum())} samples)")
    print(f"{'metric':<28}{'first':>10}{'last':>10}{'max':>10}{'slope/1k':>12}{'95% CI /1k steps':>26}{'bound':>10}")
    bounds = {**METRICS, "resources/output_dir_mb": None, "checkpoints_mb": per_checkpoint}
    bounds["bench/trainer_state_mb"] = None
    bounds["bench/log_history_mb"] = bounds["rss_less_log_history_mb"] = None
    uppers, shares = {}, []
    for metric, bound in bounds.items():
        y = np.array([log[metric] for log in rows])
        slope, low, high = slope_interval(steps[kept], y[kept], block, rng)
        verdict = "(not judged)" if bound is None else ("flat" if high * PER < bound else "GROWS")
        if bound is not None:
            shares.append(high * PER / bound)
            uppers[metric.split("/")[-1]] = high * PER
        print(
            f"{metric:<28}{y[kept][0]:>10.2f}{y[-1]:>10.2f}{y[kept].max():>10.2f}{slope * PER:>12.3f}"
            f"{f'[{low * PER:.3f}, {high * PER:.3f}]':>26}{'' if bound is None else f'{bound:.2f}':>10}  {verdict}"
        )
    figures = " ".join(f"{name}={u:.3f}" for name, u in uppers.items())
    worst = max(shares)
    flat = "yes" if worst < 1 else "no"
    print(f"RESULT long_run value={worst:.3f} target<1 steps={int(steps[-1])} flat={flat} {figures}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
