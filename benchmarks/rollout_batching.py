"""How well the rollout engine batches: N concurrent Voting episodes vs one-by-one episodes vs raw `generate`.

    python benchmarks/rollout_batching.py
    python benchmarks/rollout_batching.py --episodes 64 --completion-length 64 --hidden-size 128 --num-layers 4

A tiny Qwen3 with LoRA role adapters generates through `TransformersBackend`, every completion exactly
`--completion-length` tokens (min_new_tokens = max_new_tokens), so all three ways generate the same token counts:

    engine      `RolloutEngine.run(prompts)`: all episodes at once; Voting makes two ticks (3N voter calls, then N
                aggregator calls), each one batched `generate`;
    sequential  (a) the same engine, one episode after another: 2 `generate` calls per episode;
    raw         (b) the best one `generate` per tick can do: the engine's own requests of that round, tokenized and
                padded beforehand, through `model.generate` with the tick's adapter active (no per-sample routing,
                no chat templating, no decoding, no asyncio).

A fourth way, (b') raw `generate` with PEFT's per-sample `adapter_names=`, separates the cost of per-sample routing
from the cost of the engine itself. Every round runs the engine, then (b) and (b') on its own requests, so machine
noise hits them alike; (a) takes six times a round and runs in the first `--sequential-rounds` only. Figures are
medians over rounds. Reported: speedup of the engine over (a) and the fraction of (b)'s speed the engine reaches (raw
time / engine time, paired per round, with the spread of the per-round ratios), in CPU time (one thread, so other
jobs' load counts less; on this shared virtual machine the same work still varies from round to round), wall time
beside.

`--profile` adds, over the engine's rounds, the split of its CPU time: inside `model.generate` (the work raw
`generate` also does) and outside it, the latter by what spent it (cProfile's cumulative time of the engine's parts).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from contextlib import nullcontext

import torch
from common import median, medians, now, prompt_rows, report, since, tiny_model
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from trl_multiagent import Voting
from trl_multiagent.adapters.routing import (
    AdapterRouter,
    install_role_adapters,
    resolve_role_adapters,
    unique_adapters,
)
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend
from trl_multiagent.rollout.engine import RolloutEngine

TARGET = 0.95


class RecordingBackend(TransformersBackend):
    """Keeps each tick's requests, for the raw `generate` replay."""

    ticks: list[list]

    def generate(self, requests):
        self.ticks.append(list(requests))
        return super().generate(requests)


def raw_generate(model, backend: RecordingBackend, ticks: list[list], per_sample: bool = False) -> tuple:
    """(wall, CPU) seconds for one plain `generate` per tick on pre-padded tensors, the tick's only adapter active.

    `per_sample=True` passes PEFT's own `adapter_names=` instead: the same per-sample LoRA path the engine's routing
    takes, which tells the cost of routing apart from the cost of the engine.
    """
    tokenizer, inputs = backend.tokenizer, []
    for requests in ticks:
        prompts, adapters = [backend.tokenize(r.messages) for r in requests], [r.adapter for r in requests]
        assert len(set(adapters)) == 1, "Voting ticks use one adapter each"
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        inputs.append((ids, mask, adapters))
    start = now()
    with torch.no_grad():
        for ids, mask, adapters in inputs:
            routing = {"adapter_names": adapters} if per_sample else {}
            model.base_model.set_adapter(adapters[0])
            model.generate(input_ids=ids, attention_mask=mask, generation_config=backend.generation_config, **routing)
    return since(start)


def quartiles(values: list[float]) -> str:
    """``q1-q3`` of sorted ``values``: where the middle half of the per-round ratios lies."""
    return f"{values[len(values) // 4]:.3f}-{values[(3 * len(values)) // 4]:.3f}"


class TimedGenerate:
    """Wraps ``model.generate`` to add up the CPU seconds spent inside it while ``on``."""

    def __init__(self, model):
        self.generate, self.seconds, self.on = model.generate, 0.0, False
        model.generate = self

    def __call__(self, *args, **kwargs):
        if not self.on:
            return self.generate(*args, **kwargs)
        start = time.process_time()
        try:
            return self.generate(*args, **kwargs)
        finally:
            self.seconds += time.process_time() - start


# The engine's parts outside `generate`, as (label, cProfile function key suffix): file path end and function name.
OUTSIDE_PARTS = (
    ("rendering prompts (chat template + tokenizing)", ("chat_rendering.py", "prompt_ids_of")),
    ("decoding completions", ("chat_rendering.py", "completion_texts")),
    ("padding prompts", ("padding.py", "padded")),
    ("routing (pointing the LoRA layers)", ("routing.py", "set")),
    ("the workflow's own code (Voting.run)", ("voting.py", "run")),
)


def print_engine_split(profile: cProfile.Profile, generate_seconds: float, total_seconds: float, rounds: int) -> None:
    """Milliseconds per round: inside ``generate``, outside it, and the outside's parts by cumulative time."""
    stats = pstats.Stats(profile).stats
    print(f"\n== the engine's CPU ms per round ({rounds} rounds, outside parts under cProfile) ==")
    print(f"{'engine.run, total':<52}{1000 * total_seconds / rounds:>10.1f}")
    print(f"{'  inside model.generate':<52}{1000 * generate_seconds / rounds:>10.1f}")
    print(f"{'  outside it':<52}{1000 * (total_seconds - generate_seconds) / rounds:>10.1f}")
    for label, (path_end, function) in OUTSIDE_PARTS:
        cumulative = sum(v[3] for (f, _, name), v in stats.items() if f.endswith(path_end) and name == function)
        print(f"{'    ' + label:<52}{1000 * cumulative / rounds:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=16, help="concurrent Voting episodes (N)")
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--policy-sharing", default="isolated", choices=["shared", "isolated"])
    # The same generate of the same inputs takes 0.84-1.15x as long from one round to the next on the shared 2-core
    # machine (2026-12-03): five paired rounds left the median fraction at 0.91-0.98 from run to run, fifteen at
    # 0.93-1.02. Thirty rounds, the one-by-one episodes (a) timed in the first few only, as they take 6x a round.
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sequential-rounds", type=int, default=3, help="rounds that also time (a)")
    parser.add_argument("--profile", action="store_true", help="also split the engine's time inside/outside generate")
    args = parser.parse_args()
    if not 1 <= args.sequential_rounds <= args.rounds:
        parser.error("--sequential-rounds must be between 1 and --rounds: (a) needs at least one timing.")
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(f"{tmp}/model", args.hidden_size, args.num_layers)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora).eval()

    workflow = Voting(n_voters=3)
    role_adapters = resolve_role_adapters(workflow.roles, args.policy_sharing)
    install_role_adapters(model, unique_adapters(role_adapters))
    generation_config = GenerationConfig(
        max_new_tokens=args.completion_length,
        min_new_tokens=args.completion_length,
        do_sample=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    backend = RecordingBackend(
        lambda: nullcontext(model), tokenizer, AdapterRouter(model), generation_config, [tokenizer.eos_token_id]
    )
    rollout_engine = RolloutEngine(workflow, backend, role_adapters)
    prompts = [row["prompt"] for row in prompt_rows(args.episodes)]
    torch.manual_seed(0)
    backend.ticks = []
    rollout_engine.run(prompts[:2])  # warm-up

    times = {"engine": [], "raw": [], "raw_routed": [], "sequential": []}  # (wall, CPU) seconds per round
    for round_ in range(args.rounds):
        backend.ticks = []
        start = now()
        episodes = rollout_engine.run(prompts)
        times["engine"].append(since(start))
        times["raw"].append(raw_generate(model, backend, backend.ticks))
        times["raw_routed"].append(raw_generate(model, backend, backend.ticks, per_sample=True))
        if round_ < args.sequential_rounds:
            start = now()
            for prompt in prompts:
                rollout_engine.run([prompt])
            times["sequential"].append(since(start))

    calls = sum(len(e.calls) for e in episodes)
    tokens = sum(len(c.completion_ids) for e in episodes for c in e.calls)
    (engine_wall, engine), (seq_wall, seq), (raw_wall, raw), (routed_wall, routed) = (
        medians(times[k]) for k in ("engine", "sequential", "raw", "raw_routed")
    )
    ratios = sorted(r[1] / e[1] for r, e in zip(times["raw"], times["engine"]))  # CPU time, paired per round
    fraction = median(ratios)
    rows = [
        ("model", f"tiny Qwen3 hidden={args.hidden_size} layers={args.num_layers}, {args.policy_sharing} LoRA r=8"),
        ("workload", f"{args.episodes} Voting episodes = {calls} calls x {args.completion_length} tokens, 2 ticks"),
        ("engine s", f"{engine:.3f} CPU ({engine_wall:.3f} wall), {tokens / engine:.0f} tokens/s"),
        ("(a) sequential s", f"{seq:.3f} CPU ({seq_wall:.3f} wall), {len(times['sequential'])} rounds"),
        ("(b) raw generate s", f"{raw:.3f} CPU ({raw_wall:.3f} wall)"),
        ("(b') raw, adapter_names s", f"{routed:.3f} CPU ({routed_wall:.3f} wall): PEFT's per-sample LoRA path"),
        ("speedup over (a)", f"{seq / engine:.2f}x CPU ({seq_wall / engine_wall:.2f}x wall)"),
        ("engine vs (b')", f"{routed / engine:.3f} CPU: the engine itself, routing cost aside"),
        (
            "fraction of (b)",
            f"{fraction:.3f} CPU (median of {len(ratios)} per-round raw / engine; wall {raw_wall / engine_wall:.3f})",
        ),
        ("per-round spread", f"{ratios[0]:.3f}-{ratios[-1]:.3f}, middle half {quartiles(ratios)}"),
    ]
    if args.profile:
        # The outside parts under cProfile (which slows them); the inside/outside split from plain CPU time.
        timed = TimedGenerate(model)
        timed.on, start = True, time.process_time()
        for _ in range(args.rounds):
            rollout_engine.run(prompts)
        total, timed.on, timed.seconds = time.process_time() - start, False, timed.seconds
        inside = timed.seconds
        with cProfile.Profile() as profile:
            for _ in range(args.rounds):
                rollout_engine.run(prompts)
        print_engine_split(profile, inside, total, args.rounds)
    report("rollout_batching", rows, fraction, ">=", TARGET)


if __name__ == "__main__":
    main()
