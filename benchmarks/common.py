"""What every benchmark shares: offline setup, a tiny model, fixed-length completions, step timing, the result table.

Not a framework: each benchmark script stays readable on its own and imports only these few helpers.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import logging  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from trl_multiagent.rollout.backends.base import GenerationResult  # noqa: E402
from trl_multiagent.testing import build_tiny_qwen3  # noqa: E402

torch.set_num_threads(1)  # a tiny step is ~10x slower with two threads on these 2-core machines (NOTES-platform)
warnings.filterwarnings("ignore")
logging.getLogger("transformers").setLevel(logging.ERROR)
logging.getLogger("trl").setLevel(logging.ERROR)
transformers.utils.logging.disable_progress_bar()


def child_output(command: list[str], env: dict[str, str] | None = None) -> str:
    """The stdout of ``command``, a child process this benchmark measures in; when it fails, the child's own error
    (the end of its stderr) is printed and the benchmark exits with the child's exit code."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(
            f"{shlex.join(command)}\nexited {done.returncode}; the end of its stderr:\n{done.stderr[-4000:]}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(done.returncode)
    return done.stdout


def tiny_model(output_dir: str, hidden_size: int, num_layers: int) -> str:
    return build_tiny_qwen3(output_dir, hidden_size=hidden_size, num_layers=num_layers)


def prompt_rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"What is {i} + {i % 7}?"}]} for i in range(n)]


class FixedCompletions:
    """Completions of exactly `length` tokens (random non-special tokens, then EOS), the same for every trainer.

    Fixed lengths make the compared runs train on identical token counts whatever their sampling would produce.
    """

    def __init__(self, tokenizer, length: int, seed: int = 0):
        self.tokenizer = tokenizer
        self.length = length
        self.rng = random.Random(seed)
        self.vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]

    def prompt_ids(self, messages) -> list[int]:
        template = self.tokenizer.apply_chat_template
        return template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    def completion_ids(self) -> list[int]:
        return [self.rng.choice(self.vocab) for _ in range(self.length - 1)] + [self.tokenizer.eos_token_id]


class FixedBackend:
    """A rollout backend that answers every call with the next fixed-length completion (no model involved)."""

    def __init__(self, completions: FixedCompletions):
        self.completions = completions

    def generate(self, requests):
        results = []
        for request in requests:
            ids = self.completions.completion_ids()
            text = self.completions.tokenizer.decode(ids, skip_special_tokens=True)
            results.append(GenerationResult(self.completions.prompt_ids(request.messages), ids, text, False))
        return results


def token_parity_reward(completions, **kwargs) -> list[float]:
    """A cheap reward with variance inside every group, so each step has a real gradient."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, t)) % 2) for t in texts]


def now() -> tuple[float, float]:
    """(wall, CPU) seconds now.

    Every benchmark runs on one thread, so its CPU time is its run time minus the waits that other jobs on a shared
    machine impose: ratios use CPU time, and wall time is printed next to it.
    """
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    end = now()
    return end[0] - start[0], end[1] - start[1]


def median(values) -> float:
    return statistics.median(values)


def medians(times: list[tuple[float, float]]) -> tuple[float, float]:
    """Median wall and median CPU seconds of (wall, CPU) pairs."""
    return median(w for w, _ in times), median(c for _, c in times)


class StepTimer(TrainerCallback):
    """Time between consecutive optimizer steps: rollout, loss, backward, optimizer and logging all count."""

    def __init__(self):
        self.ends: list[tuple[float, float]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.ends = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(now())

    def intervals(self, warmup: int) -> list[tuple[float, float]]:
        """(wall, CPU) seconds of each step after the first `warmup` ones (the first step's start is not observed)."""
        marks = self.ends[warmup - 1 :] if warmup else []
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]


def alternate(trainers: dict, rounds: int, warmup: int) -> dict[str, list[tuple[float, float]]]:
    """Train each trainer in turn, A B B A ..., and collect the post-warm-up step times of every run."""
    timers = {name: StepTimer() for name in trainers}
    for name, trainer in trainers.items():
        trainer.add_callback(timers[name])
    times = {name: [] for name in trainers}
    names = list(trainers)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            trainers[name].train()
            times[name] += timers[name].intervals(warmup)
    return times


def report(name: str, rows: list[tuple[str, str]], value: float, op: str, target: float) -> None:
    """Print the table of figures, the verdict, and the RESULT line (always the very last line)."""
    met = value <= target if op == "<=" else value >= target
    rows = rows + [("target", f"{op} {target}"), ("met", "yes" if met else "NO")]
    width = max(len(label) for label, _ in rows)
    print(f"\n== {name} ==")
    for label, figure in rows:
        print(f"{label:<{width}}  {figure}")
    target_text = f"{target:g}" if float(target).is_integer() else f"{target:.2f}"
    print(f"RESULT {name} value={value:.3f} target{op}{target_text}", flush=True)
