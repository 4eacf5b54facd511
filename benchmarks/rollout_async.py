"""Async rollouts vs tick batching on the same Eval-Opt-shaped episodes (needs `vllm`, see .ci/run).

    python benchmarks/rollout_async.py
    python benchmarks/rollout_async.py --problems 64 --episodes-per-problem 8 --sim-generator-median 1500

Each episode is Eval-Opt-shaped: up to `--max-rounds` rounds of (generator, evaluator) calls in one growing
conversation, stopping after a round with probability `--p-correct` (the verdict said Correct). Every call's length is
drawn once, seeded, from a long-tailed distribution (log-normal per role, capped), and enforced per request
(`max_tokens` with `ignore_eos`, no stop tokens), so both engines generate exactly the same tokens per call.

Measured: one vLLM `AsyncLLM` (the tiny Qwen3, two LoRA role adapters, fp32, CPU) runs the same episodes through the
rollout engine twice per round, in alternating order: `rollout_mode="ticks"` (every pending call of a tick sent as one
batch, the next tick after the whole batch returned) and `rollout_mode="async"` (each call sent as its episode makes
it, batched continuously by vLLM). Same engine, same requests: the ratio is what the tick barrier costs. Wall time
(vLLM's engine core is another process), medians over `--rounds`.

Simulated: a discrete-event model of the same two schedules counts decode steps (one token for every running
sequence per step, at most `--max-num-seqs` running): ticks take the longest call of each tick in steps (less where
the cap queues calls); async lets each episode start its next call the step after its previous call ended. It runs on
the benchmark's own schedules (its predicted step ratio beside the measured wall ratio) and at the paper's scale
(`--sim-problems` x `--sim-episodes`, `--sim-*` length distribution: generator calls capped at 5,120 tokens, the
evaluator's median 131 words ~ 175 tokens, as reported). GPU time per step is modelled as `--step-ms` plus
`--seq-ms` per running sequence (decode is memory-bound: the weights are read once per step, each sequence adds its
KV reads); the step-count ratio needs no cost model.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import tempfile
import time
from dataclasses import replace

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from common import median, report, tiny_model  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_multiagent.rollout.backends.vllm_backend import AsyncVLLMBackend  # noqa: E402
from trl_multiagent.rollout.engine import RolloutEngine  # noqa: E402
from trl_multiagent.workflows import Workflow  # noqa: E402

TARGET = 1.5
ROLES = ("generator", "evaluator")


# ------------------------------------------------------------------------------------------------- the schedules
def schedules(args, episodes: int, gen_median: float, eval_median: float, cap: int, seed: int) -> list[list[int]]:
    """Per episode, the token count of each call in order (generator, evaluator, generator, ...)."""
    rng = random.Random(seed)

    def length(median_tokens: float) -> int:
        return max(1, min(cap, round(rng.lognormvariate(0.0, args.sigma) * median_tokens)))

    plans = []
    for _ in range(episodes):
        calls = []
        for _ in range(args.max_rounds):
            calls += [length(gen_median), length(eval_median)]
            if rng.random() < args.p_correct:
                break
        plans.append(calls)
    return plans


def simulate(plans: list[list[int]], max_seqs: int, mode: str) -> tuple[int, float]:
    """(decode steps, sum over steps of running sequences) of ``plans`` run as ticks or async."""
    steps = seq_steps = 0
    if mode == "ticks":
        for tick in range(max(map(len, plans))):
            lengths = [plan[tick] for plan in plans if len(plan) > tick]
            s, n = _continuous(lengths, max_seqs)
            steps, seq_steps = steps + s, seq_steps + n
        return steps, seq_steps
    # async: a call ends -> its episode's next call waits for a free slot from the next step on
    queue = [(0, e, 0) for e in range(len(plans))]  # (ready step, episode, call index), FIFO by ready step
    heapq.heapify(queue)
    running: list[tuple[int, int, int]] = []  # (end step, episode, call index)
    now = 0
    while queue or running:
        while queue and queue[0][0] <= now and len(running) < max_seqs:
            _, e, k = heapq.heappop(queue)
            heapq.heappush(running, (now + plans[e][k], e, k))
        if not running:
            now = queue[0][0]
            continue
        until = running[0][0]  # advance to the next end, or to the next step a queued call could start
        if queue and len(running) < max_seqs:
            until = min(until, max(queue[0][0], now + 1))
        seq_steps += len(running) * (until - now)
        steps += until - now
        now = until
        while running and running[0][0] <= now:
            _, e, k = heapq.heappop(running)
            if k + 1 < len(plans[e]):
                heapq.heappush(queue, (now, e, k + 1))
    return steps, seq_steps


def _continuous(lengths: list[int], max_seqs: int) -> tuple[int, int]:
    """Steps to decode independent sequences of ``lengths`` with at most ``max_seqs`` running, refilled as they end."""
    pending, running, now, seq_steps = list(lengths), [], 0, 0
    while pending or running:
        while pending and len(running) < max_seqs:
            heapq.heappush(running, now + pending.pop(0))
        until = running[0]
        seq_steps += len(running) * (until - now)
        now = until
        while running and running[0] <= now:
            heapq.heappop(running)
    return now, seq_steps


# ------------------------------------------------------------------------------------------- the real engines
class Scheduled(Workflow):
    """Eval-Opt's conversation shape, each call's length fixed by the episode's plan (tagged in the request)."""

    roles = ROLES

    def __init__(self, plans: list[list[int]]):
        self.plans = plans

    async def run(self, prompt, generate):
        episode = int(prompt[-1]["content"].split()[1])
        messages = list(prompt)
        answer = ""
        for k in range(len(self.plans[episode])):
            role = ROLES[k % 2]
            messages.append({"role": "user", "content": f"call {episode} {k}: {'solve' if k % 2 == 0 else 'judge'}"})
            text = await generate(role, messages)
            messages.append({"role": "assistant", "content": text})
            answer = text if role == "generator" else answer
        return answer


class ExactLengths:
    """Sends each call with its planned ``max_tokens`` and ``ignore_eos`` (read from the call's tag)."""

    def __init__(self, backend: AsyncVLLMBackend, plans: list[list[int]]):
        self.backend, self.plans = backend, plans

    def _exact(self, request):
        _, episode, k = request.messages[-1]["content"].split(":")[0].split()
        tokens = self.plans[int(episode)][int(k)]
        return replace(request, generation_kwargs={"max_tokens": tokens, "ignore_eos": True})

    def generate(self, requests):
        return self.backend.generate([self._exact(r) for r in requests])

    async def agenerate(self, request):
        return await self.backend.agenerate(self._exact(request))

    def drain(self) -> None:
        self.backend.drain()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--episodes-per-problem", type=int, default=4)
    parser.add_argument("--max-rounds", type=int, default=3, help="Eval-Opt's max_iterations (3 for math)")
    parser.add_argument("--p-correct", type=float, default=0.4, help="chance a round's verdict ends the episode")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal shape of every call length")
    parser.add_argument("--generator-median", type=int, default=24, help="CPU run: generator tokens, median")
    parser.add_argument("--evaluator-median", type=int, default=8)
    parser.add_argument("--cap", type=int, default=192, help="CPU run: max tokens per call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--sim-problems", type=int, default=64)
    parser.add_argument("--sim-episodes", type=int, default=8)
    parser.add_argument("--sim-generator-median", type=float, default=1500.0)
    parser.add_argument("--sim-evaluator-median", type=float, default=175.0)
    parser.add_argument("--sim-cap", type=int, default=5120)
    parser.add_argument("--max-num-seqs", type=int, default=256, help="simulated: vLLM's running-sequence cap")
    parser.add_argument("--step-ms", type=float, default=12.0, help="simulated GPU: ms per decode step")
    parser.add_argument("--seq-ms", type=float, default=0.06, help="simulated GPU: ms per running sequence per step")
    args = parser.parse_args()

    episodes = args.problems * args.episodes_per_problem
    plans = schedules(args, episodes, args.generator_median, args.evaluator_median, args.cap, args.seed)
    tokens = sum(map(sum, plans))

    with tempfile.TemporaryDirectory() as folder:
        model_dir = tiny_model(os.path.join(folder, "model"), args.hidden_size, args.num_layers)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora, adapter_name=ROLES[0])
        model.add_adapter(ROLES[1], LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.1)
        started = time.perf_counter()
        vllm = AsyncVLLMBackend(
            model_dir,
            tokenizer,
            ROLES,
            lora_rank=8,
            sampling=dict(temperature=1.0),
            eos_token_ids=[],
            dtype="float32",
            enforce_eager=True,
            seed=args.seed,
            max_num_seqs=max(episodes, 8),
        )
        vllm.sync_adapters(model)
        start_s = time.perf_counter() - started
        backend = ExactLengths(vllm, plans)
        workflow, routes = Scheduled(plans), {role: role for role in ROLES}
        engines = {mode: RolloutEngine(workflow, backend, routes, mode=mode) for mode in ("ticks", "async")}
        prompts = [
            [{"role": "user", "content": f"episode {e} of problem {e // args.episodes_per_problem}"}]
            for e in range(episodes)
        ]
        engines["async"].run(prompts[:4])  # warm-up
        times: dict[str, list[float]] = {"ticks": [], "async": []}
        for r in range(args.rounds):
            for mode in ("ticks", "async") if r % 2 == 0 else ("async", "ticks"):
                started = time.perf_counter()
                done = engines[mode].run(prompts)
                times[mode].append(time.perf_counter() - started)
                made = sum(len(c.completion_ids) for e in done for c in e.calls)
                assert made == tokens, f"{mode}: {made} tokens generated, {tokens} planned"
        vllm.close()
    ratio = median(times["ticks"]) / median(times["async"])

    cpu_steps = {mode: simulate(plans, max(episodes, 8), mode)[0] for mode in ("ticks", "async")}
    sim_plans = schedules(
        args,
        args.sim_problems * args.sim_episodes,
        args.sim_generator_median,
        args.sim_evaluator_median,
        args.sim_cap,
        args.seed,
    )
    sim = {mode: simulate(sim_plans, args.max_num_seqs, mode) for mode in ("ticks", "async")}
    uncapped = {mode: simulate(sim_plans, len(sim_plans), mode)[0] for mode in ("ticks", "async")}
    gpu_s = {mode: (steps * args.step_ms + seqs * args.seq_ms) / 1000 for mode, (steps, seqs) in sim.items()}
    calls = sum(map(len, plans))
    rows = [
        (
            "CPU run",
            f"{episodes} episodes, {calls} calls, {tokens} tokens; call lengths median "
            f"{args.generator_median}/{args.evaluator_median} (generator/evaluator), sigma {args.sigma}, "
            f"cap {args.cap}; engine start + sync {start_s:.1f} s",
        ),
        ("ticks wall s", " ".join(f"{t:.2f}" for t in times["ticks"]) + f" (median {median(times['ticks']):.2f})"),
        ("async wall s", " ".join(f"{t:.2f}" for t in times["async"]) + f" (median {median(times['async']):.2f})"),
        (
            "measured ticks/async",
            f"{ratio:.3f} (per round: "
            + " ".join(f"{t / a:.2f}" for t, a in zip(times["ticks"], times["async"]))
            + ")",
        ),
        (
            "simulated, same plans",
            f"decode steps ticks {cpu_steps['ticks']} / async {cpu_steps['async']} = "
            f"{cpu_steps['ticks'] / cpu_steps['async']:.2f}",
        ),
        (
            "paper scale",
            f"{args.sim_problems} x {args.sim_episodes} episodes, {sum(map(len, sim_plans))} calls; "
            f"medians {args.sim_generator_median:g}/{args.sim_evaluator_median:g}, cap {args.sim_cap}, "
            f"max_num_seqs {args.max_num_seqs}",
        ),
        (
            "simulated GPU steps",
            f"ticks {sim['ticks'][0]} / async {sim['async'][0]} = {sim['ticks'][0] / sim['async'][0]:.2f}",
        ),
        (
            "... every episode running",
            f"ticks {uncapped['ticks']} / async {uncapped['async']} = "
            f"{uncapped['ticks'] / uncapped['async']:.2f} (decode steps, no sequence cap)",
        ),
        (
            "simulated GPU time",
            f"ticks {gpu_s['ticks']:.0f} s / async {gpu_s['async']:.0f} s = "
            f"{gpu_s['ticks'] / gpu_s['async']:.2f} ({args.step_ms:g} ms/step + "
            f"{args.seq_ms:g} ms/sequence)",
        ),
    ]
    report("rollout_async", rows, ratio, ">=", TARGET)


if __name__ == "__main__":
    main()
