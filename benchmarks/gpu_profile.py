"""One Eval-Opt training step of a Qwen3-0.6B-sized model on one GPU: tokens/s, time split, peak memory.

    python benchmarks/gpu_profile.py                # one GPU, no network, no vLLM; under 5 minutes on an H200
    python benchmarks/gpu_profile.py --cpu-smoke    # the same code path at tiny size, on CPU (what CI runs)
    python benchmarks/gpu_profile.py --rollout-budget 900   # let every call reach the 5120-token cap

The model is randomly initialised from Qwen3-0.6B's real config (written below; nothing is downloaded), with a
word-level tokenizer over its 151,936 ids so that generated text re-tokenizes to exactly as many tokens as were
generated: prompts that quote earlier outputs (the evaluator's, the refining generator's) grow as in a real run.
A random model never writes EOS nor `\\boxed{Correct}`, so every episode runs all `max_iterations` (6 calls) and every
call generates up to the cap: the worst case of the paper's Eval-Opt math setting (max response 5120 tokens,
3 iterations, 8 episodes per problem, LoRA r=64/alpha=32 on all linear layers, isolated policies, temperature 0.7,
clip-high 0.28, bf16).

With `generate` decoding one token per forward, 6 sequential ticks of 5120 tokens take far longer than 5 minutes, so
each tick stops at `--rollout-budget / 6` seconds (transformers' `max_time`) and the report extrapolates the
full-length rollout from the measured decode speed; the training phases run on whatever was generated.

Printed: rollout / logprobs (the loss forward) / backward / optimizer / other seconds of the step, generated and
trained tokens/s, decode ms per token, longest sample, and peak GPU memory. The last line is
`RESULT gpu_profile value=<wall seconds of the whole script> target<=300`.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from collections import defaultdict  # noqa: E402

import torch  # noqa: E402
from common import prompt_rows, report, token_parity_reward  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    PreTrainedTokenizerFast,
    PrinterCallback,
    Qwen3Config,
    Qwen3ForCausalLM,
    TrainerCallback,
)

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, MultiAgentGRPOTrainer  # noqa: E402
from trl_multiagent.testing import qwen_style_tokenizer  # noqa: E402

TARGET_SECONDS = 300
QWEN3_0_6B = dict(  # Qwen/Qwen3-0.6B config.json
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
TINY.update(intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Every id is a word (`w123`), so decoding then re-encoding generated ids keeps their count."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = qwen_style_tokenizer(words)
    tokenizer.unk_token = "<unk>"
    return tokenizer


class PhaseTimer(TrainerCallback):
    """Seconds per phase of the step; waits for the GPU at each boundary so queued kernels count where they run."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        self.seconds: dict[str, float] = defaultdict(float)
        self._started: dict[str, float] = {}

    def start(self, name: str) -> None:
        self.sync()
        self._started[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        self.sync()
        self.seconds[name] += time.perf_counter() - self._started.pop(name)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            self.start(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stop(name)

        return timed

    def on_step_begin(self, args, state, control, **kwargs):
        self.start("step")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.start("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.stop("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        self.stop("step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: tests the code path")
    parser.add_argument("--completion-length", type=int, help="token cap of every call (default: 5120, smoke: 16)")
    parser.add_argument("--max-iterations", type=int, default=3, help="Eval-Opt iterations (paper: 3 math, 2 code)")
    parser.add_argument("--episodes", type=int, default=8, help="episodes of one problem (num_generations)")
    parser.add_argument("--micro-batches", type=int, default=4, help="gradient accumulation steps of the one step")
    parser.add_argument("--policy-sharing", default="isolated", choices=["shared", "isolated"])
    parser.add_argument("--rollout-budget", type=float, default=120.0, help="seconds for all rollout ticks together")
    args = parser.parse_args()
    if args.episodes % args.micro_batches:
        parser.error(f"--episodes {args.episodes} must be a multiple of --micro-batches {args.micro_batches}")
    torch.set_num_threads(1)
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit(
            "gpu_profile.py needs a CUDA GPU: it profiles a Qwen3-0.6B-sized model at the paper's lengths, which "
            "would take hours on CPU. No GPU is visible here. To test the same code path at tiny size on CPU, run "
            "`python benchmarks/gpu_profile.py --cpu-smoke`."
        )
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    cap = args.completion_length or (16 if args.cpu_smoke else 5120)
    ticks = 2 * args.max_iterations
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16

    # 1. A random model of the real shape, built on the device, and its word-level tokenizer.
    config = Qwen3Config(**(TINY if args.cpu_smoke else QWEN3_0_6B))
    tokenizer = word_tokenizer(config.vocab_size)
    config.update(dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    # 2. The trainer at the paper's Eval-Opt settings, one problem x `episodes` episodes, one optimizer step.
    lora_r = 8 if args.cpu_smoke else 64
    trainer = MultiAgentGRPOTrainer(
        model=model,
        workflow=EvalOpt(max_iterations=args.max_iterations, task="math"),
        reward_funcs=token_parity_reward,
        args=MultiAgentGRPOConfig(
            output_dir="/tmp/gpu_profile",
            policy_sharing=args.policy_sharing,
            use_cpu=args.cpu_smoke,
            bf16=not args.cpu_smoke,
            per_device_train_batch_size=args.episodes // args.micro_batches,
            gradient_accumulation_steps=args.micro_batches,
            num_generations=args.episodes,
            max_completion_length=cap,
            generation_kwargs={"max_time": args.rollout_budget / ticks},
            temperature=0.7,
            epsilon_high=0.28,
            loss_type="grpo",
            beta=0.0,
            learning_rate=2e-5,
            max_steps=1,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
        ),
        train_dataset=Dataset.from_list(prompt_rows(4)),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=lora_r, lora_alpha=lora_r // 2, target_modules="all-linear", lora_dropout=0.0),
    )
    trainer.remove_callback(PrinterCallback)

    # 3. Time the phases in place: the rollout engine, the loss forward, backward, the optimizer (callbacks).
    timer = PhaseTimer(device)
    trainer.add_callback(timer)
    episodes, tick_stats = [], []
    run_episodes = trainer.engine.run
    generate = trainer.rollout_backend.generate

    def recorded_run(prompts):
        episodes.extend(run_episodes(prompts))
        return episodes[-len(prompts) :]

    def recorded_generate(requests):
        began = time.perf_counter()
        results = generate(requests)
        longest = max(len(r.completion_ids) for r in results)
        tick_stats.append((time.perf_counter() - began, longest))
        return results

    trainer.engine.run = timer.wrap("rollout", recorded_run)
    trainer.rollout_backend.generate = recorded_generate
    trainer._logps_and_entropies = timer.wrap("logprobs", trainer._logps_and_entropies)
    trainer.accelerator.backward = timer.wrap("backward", trainer.accelerator.backward)

    with torch.no_grad():  # CUDA context, cuBLAS handles and kernels load here, not inside the first tick
        trainer.model(input_ids=torch.ones(1, 8, dtype=torch.long, device=device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()

    # 4. Report.
    seconds = timer.seconds
    step = seconds["step"]
    phases = ["rollout", "logprobs", "backward", "optimizer"]
    other = step - sum(seconds[p] for p in phases)
    calls = [c for e in episodes for c in e.calls]
    generated = sum(len(c.completion_ids) for c in calls)
    trained = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    longest = max(calls, key=lambda c: len(c.prompt_ids) + len(c.completion_ids))
    decode_ms = 1000 * sum(s for s, _ in tick_stats) / max(sum(n for _, n in tick_stats), 1)
    if device.type == "cuda":
        gib = 2**30
        memory = f"{torch.cuda.max_memory_allocated() / gib:.1f} GiB allocated, "
        memory += f"{torch.cuda.max_memory_reserved() / gib:.1f} GiB reserved"
        name = torch.cuda.get_device_name()
    else:
        memory = f"CPU run: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
        name = "CPU (smoke)"
    params = sum(p.numel() for p in model.parameters()) / 1e6  # the base model: PEFT wraps it in place
    rows = [
        ("device", f"{name}, {str(dtype).removeprefix('torch.')}"),
        ("model", f"Qwen3 {config.num_hidden_layers} layers x {config.hidden_size}, {params:.1f}M params, random"),
        ("adapters", f"LoRA r={lora_r} on all linear layers, {args.policy_sharing}: {trainer.adapter_names}"),
        ("step", f"Eval-Opt: {len(episodes)} episodes, {len(calls)} calls, cap {cap} tokens, {len(tick_stats)} ticks"),
    ]
    rows += [(phase, f"{seconds[phase]:8.2f} s  {100 * seconds[phase] / step:5.1f}%") for phase in phases]
    rows += [
        ("other", f"{other:8.2f} s  {100 * other / step:5.1f}%  (rewards, batching, clipping, logging)"),
        ("step total", f"{step:8.2f} s"),
        ("generated tokens/s", f"{generated / seconds['rollout']:.0f} ({generated} tokens; {decode_ms:.1f} ms/token)"),
        ("trained tokens/s", f"{trained / (seconds['logprobs'] + seconds['backward']):.0f} ({trained} tokens)"),
        ("longest sample", f"prompt {len(longest.prompt_ids)} + completion {len(longest.completion_ids)} tokens"),
        ("peak memory", memory),
    ]
    if any(n < cap for _, n in tick_stats):
        full = decode_ms * ticks * cap / 1000
        rows.append(("full-length rollout", f"~{full:.0f} s estimated ({ticks} ticks x {cap} tokens; capped by time)"))
    wall = time.perf_counter() - START
    rows.append(("wall time", f"{wall:.1f} s (whole script)"))
    report("gpu_profile", rows, wall, "<=", TARGET_SECONDS)


if __name__ == "__main__":
    main()
