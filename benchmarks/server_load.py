"""One `vllm serve` under many calls at once: two LoRA roles driven by the rollout engine at 16, 64 and 256 calls in
flight (needs `vllm`, see .ci/run).

    python benchmarks/server_load.py
    python benchmarks/server_load.py --levels 16 64 256 --rounds 3 --max-tokens 16

The server is started the way users start it (`trl-multiagent vllm-serve`, on 127.0.0.1, the tiny Qwen3 in fp32) and
stopped at the end, whatever happens. The client is the package's own `VLLMServerBackend` (what a training run with
`vllm_mode="server"` uses), its bound on requests in flight `vllm_server_max_concurrency` (`--max-concurrency`). At a
level of N, N Eval-Opt-shaped episodes run at once through the rollout engine (async mode): each makes a generator
call, then an evaluator call on the conversation so far, so N calls are in flight until episodes finish.

Per level and round: calls/s (calls answered / wall seconds of the rollout) and the latency of each call (from the
workflow's `generate` to its answer, waits for a free slot included), as p50/p90/p99. Every call is counted by an id
of its own: answered, failed (its error is printed), or neither (lost); an id answered more than once is duplicated.
The server's own count of finished requests (`vllm:request_success_total` on /metrics) must equal the calls answered:
a request the client retried after the server had answered it would show there. Each answer must name its role's
adapter (the server's word on what served it). The server's peak of requests running and waiting, sampled from
/metrics, shows the bound holding. Memory after each level: the server's process tree (PSS, which counts memory the
engine's processes share once) and this process's RSS (the trainer's side of the rollout).

Its last line: `RESULT server_load lost=<n> duplicated=<n> p99_ms=<x>` (lost and duplicated over every level, the p99
at the largest level, median over rounds). It exits 1 if any call was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from common import median, tiny_model  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_multiagent.rollout.backends.vllm_server import VLLMServerBackend  # noqa: E402
from trl_multiagent.rollout.engine import RolloutEngine  # noqa: E402
from trl_multiagent.workflows import Workflow  # noqa: E402

ROLES = ("generator", "evaluator")
SERVER_START_S = 900  # the most a server may take to answer /health on a busy 2-core machine


class GenerateThenJudge(Workflow):
    """Eval-Opt's shape at one round: the generator answers, the evaluator judges the conversation so far."""

    roles = ROLES

    async def run(self, prompt, generate):
        messages = list(prompt)
        answer = await generate("generator", messages)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Is that right?"}]
        await generate("evaluator", messages)
        return answer


class CountedCalls:
    """Gives every call an id of its own and records what became of it: answered (with its latency and the adapter
    the server says served it), failed (with its error), or cancelled (another call failed and the rollout stopped)."""

    def __init__(self, backend: VLLMServerBackend):
        self.backend = backend
        self.ids = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.sent: list[int] = []
        self.answered: Counter[int] = Counter()
        self.failed: dict[int, str] = {}
        self.latency_ms: list[float] = []
        self.wrong_adapter = 0

    async def agenerate(self, request):
        call = next(self.ids)
        self.sent.append(call)
        started = time.perf_counter()
        try:
            result = await self.backend.agenerate(request)
        except asyncio.CancelledError:
            self.failed[call] = "cancelled: another call of the rollout failed"
            raise
        except Exception as error:
            self.failed[call] = f"{type(error).__name__}: {error}"
            raise
        self.latency_ms.append((time.perf_counter() - started) * 1000)
        self.answered[call] += 1
        self.wrong_adapter += result.provenance.adapter != request.adapter
        return result

    def drain(self) -> None:
        self.backend.drain()

    def lost(self) -> int:
        return sum(1 for call in self.sent if call not in self.answered and call not in self.failed)

    def duplicated(self) -> int:
        return sum(1 for count in self.answered.values() if count > 1)


# ----------------------------------------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, timeout: float = 10.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.read().decode()
    except OSError:
        return None


def start_server(model_dir: str, port: int, log: Path, rank: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "trl_multiagent.cli", "vllm-serve", "--model", model_dir, "--workflow"]
    command += ["eval_opt", "--lora_r", str(rank), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--dtype", "float32", "--enforce-eager", "--seed", "0"]  # passed through to vLLM
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    with open(log, "w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + SERVER_START_S
    while get(f"http://127.0.0.1:{port}/health", timeout=5) is None:
        if server.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            sys.exit(f"the server did not start; the end of its log ({log}):\n{log.read_text()[-3000:]}")
        time.sleep(1.0)
    return server


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM (`vllm-serve` stops the API server, its engine and workers, and their /dev/shm files), then SIGKILL."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def metric(url: str, name: str) -> float:
    """The sum of the series of ``name`` on the server's /metrics (one per model name vLLM labels)."""
    text = get(f"{url}/metrics") or ""
    return sum(float(value) for value in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


class PeakQueue:
    """Samples the server's requests running + waiting (/metrics) every ``every`` s on a thread, keeping the peak."""

    def __init__(self, url: str, every: float = 0.1):
        self.url, self.every, self.peak = url, every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            now = metric(self.url, "vllm:num_requests_running") + metric(self.url, "vllm:num_requests_waiting")
            self.peak = max(self.peak, now)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.peak


def tree_pss_mb(pid: int) -> float:
    """PSS of ``pid`` and every process below it, in MB (shared pages divided among the processes that map them)."""
    total, todo = 0, [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                todo += [int(child) for child in children.read_text().split()]
            except OSError:
                pass
        try:
            rollup = Path(f"/proc/{parent}/smaps_rollup").read_text()
        except OSError:
            continue
        total += int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1))
    return total / 1024


def own_rss_mb() -> float:
    return int(re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) / 1024


# -------------------------------------------------------------------------------------------------------- the run
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64, 256], help="calls in flight")
    parser.add_argument("--rounds", type=int, default=3, help="rollouts per level (levels interleaved)")
    parser.add_argument("--max-tokens", type=int, default=16, help="most tokens per call")
    parser.add_argument(
        "--max-concurrency", type=int, default=256, help="vllm_server_max_concurrency: most requests in flight"
    )
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--lora-r", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        model_dir = tiny_model(os.path.join(folder, "model"), args.hidden_size, args.num_layers)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora(args.lora_r), ROLES[0])
        model.add_adapter(ROLES[1], lora(args.lora_r))
        with torch.no_grad():  # random, different adapters: a zero B would make every role the base model
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.1)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        server = start_server(model_dir, port, Path(folder) / "server.log", args.lora_r)
        try:
            start_s = time.perf_counter() - started
            rows, figures = measure(args, url, server, model, tokenizer)
        finally:
            stop_server(server)
    rows.insert(0, ("setup", f"server start {start_s:.0f} s; max_tokens {args.max_tokens}, rounds {args.rounds}"))
    width = max(len(label) for label, _ in rows)
    print("\n== server_load ==")
    for label, figure in rows:
        print(f"{label:<{width}}  {figure}")
    largest = figures[max(args.levels)]
    lost = sum(f["lost"] for f in figures.values())
    duplicated = sum(f["duplicated"] for f in figures.values())
    print(f"RESULT server_load lost={lost} duplicated={duplicated} p99_ms={largest['p99_ms']:.1f}", flush=True)
    if lost or duplicated:
        sys.exit(1)


def lora(rank: int) -> LoraConfig:
    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0)


def measure(args, url: str, server: subprocess.Popen, model, tokenizer) -> tuple[list, dict]:
    backend = VLLMServerBackend(
        url,
        tokenizer,
        ROLES,
        {"max_tokens": args.max_tokens, "temperature": 1.0},
        [tokenizer.eos_token_id],
        timeout=60,
        request_timeout=600,
        max_concurrency=args.max_concurrency,
    )
    try:
        backend.sync_adapters(model)
        calls = CountedCalls(backend)
        engine = RolloutEngine(GenerateThenJudge(), calls, {role: role for role in ROLES}, mode="async")
        engine.run([[{"role": "user", "content": "warm up"}]] * 4)
        per_level: dict[int, dict[str, list]] = {level: {} for level in args.levels}
        for _ in range(args.rounds):
            for level in args.levels:
                prompts = [[{"role": "user", "content": f"What is {i} + {i % 7}?"}] for i in range(level)]
                calls.reset()
                before = metric(url, "vllm:request_success_total")
                peak = PeakQueue(url)
                began = time.perf_counter()
                try:
                    episodes = engine.run(prompts)
                    error = None
                except Exception as failure:  # counted below: every call answered, failed or lost
                    episodes, error = [], failure
                wall = time.perf_counter() - began
                peak_queue = peak.stop()
                finished = metric(url, "vllm:request_success_total") - before
                answered = sum(calls.answered.values())
                whole = sum(1 for e in episodes if len(e.calls) == 2)
                seen = per_level[level]
                for key, value in (
                    ("calls_per_s", answered / wall),
                    ("p50_ms", percentile(calls.latency_ms, 50)),
                    ("p90_ms", percentile(calls.latency_ms, 90)),
                    ("p99_ms", percentile(calls.latency_ms, 99)),
                    ("lost", calls.lost()),
                    ("duplicated", calls.duplicated() + max(0, round(finished) - answered)),
                    ("failed", len(calls.failed)),
                    ("wrong_adapter", calls.wrong_adapter),
                    ("whole_episodes", whole),
                    ("peak_queue", peak_queue),
                ):
                    seen.setdefault(key, []).append(value)
                if error is not None:
                    print(f"level {level}: the rollout failed: {error}", file=sys.stderr, flush=True)
                    for call, why in sorted(calls.failed.items())[:5]:
                        print(f"  call {call}: {why}", file=sys.stderr, flush=True)
                seen.setdefault("server_pss_mb", []).append(tree_pss_mb(server.pid))
                seen.setdefault("trainer_rss_mb", []).append(own_rss_mb())
    finally:
        backend.close()
    return table(args, per_level)


def table(args, per_level: dict[int, dict[str, list]]) -> tuple[list, dict]:
    rows, figures = [], {}
    for level, seen in per_level.items():
        figures[level] = {
            "lost": sum(seen["lost"]),
            "duplicated": sum(seen["duplicated"]),
            "p99_ms": median(seen["p99_ms"]),
        }

        def spread(key: str, form: str = ".0f", seen: dict[str, list] = seen) -> str:
            values = seen[key]
            return f"{median(values):{form}} ({min(values):{form}}-{max(values):{form}})"

        rows += [
            (
                f"{level} in flight",
                f"calls/s {spread('calls_per_s', '.1f')}; latency ms p50 {spread('p50_ms')}, p90 {spread('p90_ms')}, "
                f"p99 {spread('p99_ms')} (median, range over {args.rounds} rounds)",
            ),
            (
                f"{level} calls",
                f"{2 * level * args.rounds} sent: lost {sum(seen['lost'])}, duplicated {sum(seen['duplicated'])}, "
                f"failed {sum(seen['failed'])}, wrong adapter {sum(seen['wrong_adapter'])}; whole episodes "
                f"{sum(seen['whole_episodes'])}/{level * args.rounds}; server's peak running+waiting "
                f"{max(seen['peak_queue']):.0f} (bound {args.max_concurrency})",
            ),
            (
                f"{level} memory MB",
                f"server PSS {spread('server_pss_mb')}, trainer RSS {spread('trainer_rss_mb')}",
            ),
        ]
    return rows, figures


if __name__ == "__main__":
    main()
