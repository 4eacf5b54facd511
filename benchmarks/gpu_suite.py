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
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from common import prompt_rows, token_parity_reward  # noqa: E402
from datasets import Dataset  # noqa: E402
from drawn_lengths import DrawnLengths, word_tokenizer  # noqa: E402
from model_flops import DecoderShape, backward_flops, forward_flops  # noqa: E402
from peft import LoraConfig  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook  # noqa: E402
from transformers import PrinterCallback, Qwen3Config, Qwen3ForCausalLM, TrainerCallback  # noqa: E402

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, MultiAgentGRPOTrainer, SingleAgent  # noqa: E402
from trl_multiagent.rollout.backends.base import GenerationRequest  # noqa: E402
from trl_multiagent.rollout.backends.from_config import build_backend  # noqa: E402
from trl_multiagent.rollout.padding import padded  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATASHEET_BF16_TFLOPS = 989.0  # H100/H200 SXM, dense bf16 (NVIDIA's datasheet)
QWEN3_1_7B = dict(  # Qwen/Qwen3-1.7B config.json
    hidden_size=2048,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=6144,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
TINY.update(intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)
SECTIONS = ("peak", "training", "memory", "decode", "recipes", "vllm")


class Sizes:
    """The suite's sizes: the paper's on a GPU, the same shapes scaled down for the CPU smoke run."""

    def __init__(self, smoke: bool):
        self.smoke = smoke
        self.model = TINY if smoke else QWEN3_1_7B
        self.dtype = torch.float32 if smoke else torch.bfloat16
        self.lora_rank = 8 if smoke else 64
        self.completion_cap = 64 if smoke else 5120
        self.lengths = (
            {"generator": (16, 64), "evaluator": (4, 24)}
            if smoke
            else {
                "generator": (1024, 5120),
                "evaluator": (256, 1536),
            }
        )
        self.token_bound = 640 if smoke else 51200
        self.memory_sample = (24, 40) if smoke else (1024, 4096)  # prompt, completion: 10 of them fill the bound
        self.matmul = 256 if smoke else 8192
        self.decode_prompt, self.decode_tokens = (24, 8) if smoke else (400, 128)


class PhaseClock(TrainerCallback):
    """Seconds per phase of each optimizer step, waiting for the GPU at every boundary so kernels count where they
    run. Phases: rollout, logps_before_update (forwards without gradient), loss_forward, backward, optimizer."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        self.steps: list[dict] = []
        self.current: dict = defaultdict(float)
        self.samples: list[tuple[int, int]] = []  # (tokens, completion tokens) of the step's training samples
        self.forward_tokens = [0, 0]  # real, padded tokens of the step's log-prob forwards
        self._began = 0.0

    def timed(self, phase, fn):
        def run(*args, **kwargs):
            name = phase(*args, **kwargs) if callable(phase) else phase
            self.sync()
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.current[name] += time.perf_counter() - began

        return run

    def on_step_begin(self, args, state, control, **kwargs):
        self.current, self.samples, self.forward_tokens = defaultdict(float), [], [0, 0]
        self.sync()
        self._began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.sync()
        step = dict(self.current, step=time.perf_counter() - self._began)
        step["samples"] = list(self.samples)
        step["forward_tokens"] = list(self.forward_tokens)
        self.steps.append(step)


def logp_phase(model, input_ids, attention_mask, *args, **kwargs) -> str:
    return "loss_forward" if torch.is_grad_enabled() else "logps_before_update"


def clocked_trainer(trainer, clock: PhaseClock):
    """Wrap the trainer's phases with ``clock`` (attributes of this one instance; nothing global stays changed)."""
    run_episodes = trainer.engine.run

    def recorded(*args, **kwargs):
        episodes = run_episodes(*args, **kwargs)
        for call in (c for e in episodes for c in e.calls):
            clock.samples.append((len(call.prompt_ids) + len(call.completion_ids), len(call.completion_ids)))
        return episodes

    logps = trainer.per_token_logps_and_entropies

    def counted(model, input_ids, attention_mask, *args, **kwargs):
        clock.forward_tokens[0] += int(attention_mask.sum())
        clock.forward_tokens[1] += attention_mask.numel()
        return logps(model, input_ids, attention_mask, *args, **kwargs)

    trainer.engine.run = clock.timed("rollout", recorded)
    trainer.per_token_logps_and_entropies = clock.timed(logp_phase, counted)
    trainer.accelerator.backward = clock.timed("backward", trainer.accelerator.backward)
    trainer.add_callback(clock)
    trainer.remove_callback(PrinterCallback)


def optimizer_clock(clock: PhaseClock):
    """Time every optimizer step (the Trainer's and each mini-batch's own) with torch's global step hooks."""
    state = {}

    def before(optimizer, args, kwargs):
        clock.sync()
        state["began"] = time.perf_counter()

    def after(optimizer, args, kwargs):
        clock.sync()
        clock.current["optimizer"] += time.perf_counter() - state.pop("began")

    return [
        register_optimizer_step_pre_hook(before),
        register_optimizer_step_post_hook(after),
    ]


def random_model(sizes: Sizes, device: torch.device, tokenizer):
    config = Qwen3Config(**sizes.model)
    config.update(dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(sizes.dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def paper_config(sizes: Sizes, **overrides) -> MultiAgentGRPOConfig:
    """The paper preset's update (recipes/configs/paper_math.yaml) at the suite's size."""
    settings = dict(
        output_dir=tempfile.mkdtemp(prefix="gpu_suite-"),
        use_cpu=sizes.smoke,
        bf16=not sizes.smoke,
        max_completion_length=sizes.completion_cap,
        temperature=0.7,
        epsilon_high=0.28,
        delta=3.0,
        loss_type="grpo",
        beta=0.0,
        learning_rate=2e-5,
        weight_decay=0.01,
        max_grad_norm=1.0,
        max_tokens_per_micro_batch=sizes.token_bound,
        vllm_importance_sampling_correction=False,
        gradient_checkpointing=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    settings.update(overrides)
    return MultiAgentGRPOConfig(**settings)


def significant(value: float) -> float:
    return float(f"{value:.4g}")


def lora(sizes: Sizes) -> LoraConfig:
    return LoraConfig(r=sizes.lora_rank, lora_alpha=sizes.lora_rank // 2, target_modules="all-linear", lora_dropout=0)


# ------------------------------------------------------------------------------------------------------- sections
def peak(sizes: Sizes, device: torch.device, **_) -> dict:
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


def training(sizes: Sizes, device: torch.device, steps: int, episodes: int, max_iterations: int, **_) -> dict:
    tokenizer = word_tokenizer(sizes.model["vocab_size"])
    model = random_model(sizes, device, tokenizer)
    shape = DecoderShape.of(model.config)
    backend = DrawnLengths(tokenizer, sizes.lengths)
    trainer = MultiAgentGRPOTrainer(
        model=model,
        workflow=EvalOpt(max_iterations=max_iterations, task="math"),
        reward_funcs=token_parity_reward,
        args=paper_config(
            sizes,
            policy_sharing="isolated",
            num_generations=episodes,
            per_device_train_batch_size=episodes,
            gradient_accumulation_steps=1,
            update_schedule="mini_batches",
            mini_batch_prompts=1,
            clip_grad_norm_per_adapter=True,
            lr_scheduler_steps="per_update",
            advantage_groups="calls",
            max_steps=steps,
        ),
        train_dataset=Dataset.from_list(prompt_rows(steps)),
        processing_class=tokenizer,
        peft_config=lora(sizes),
        rollout_backend=backend,
    )
    clock = PhaseClock(device)
    clocked_trainer(trainer, clock)
    hooks = optimizer_clock(clock)
    try:
        trainer.train()
    finally:
        for hook in hooks:
            hook.remove()
    peak_tflops = measured_peak(device, sizes)
    report = {"first_step": step_figures(clock.steps[0], shape, sizes, peak_tflops)}
    warm = [step_figures(s, shape, sizes, peak_tflops) for s in clock.steps[1:]]
    report["warm_steps"] = warm
    if warm:
        report["warm_mean"] = {k: significant(sum(w[k] for w in warm) / len(warm)) for k in warm[0]}
    report["peak_tflops_used"] = peak_tflops
    report["adapters"] = list(trainer.adapter_names)
    return report


_PEAK: dict[str, float] = {}


def measured_peak(device: torch.device, sizes: Sizes) -> float:
    if "tflops" not in _PEAK:
        _PEAK["tflops"] = peak(sizes, device)["measured_tflops"]
    return _PEAK["tflops"]


def step_figures(step: dict, shape: DecoderShape, sizes: Sizes, peak_tflops: float) -> dict:
    samples = step["samples"]
    forwards = 1 + (step.get("logps_before_update", 0.0) > 0)  # the loss's, and the one before the update if any
    flops = sum(
        forwards * forward_flops(shape, tokens=n, completion=c, lora_rank=sizes.lora_rank)
        + backward_flops(shape, tokens=n, completion=c, lora_rank=sizes.lora_rank)
        for n, c in samples
    )
    phases = ("logps_before_update", "loss_forward", "backward", "optimizer")
    training_s = sum(step.get(p, 0.0) for p in phases)
    real, padded_tokens = step["forward_tokens"]
    figures = {p: round(step.get(p, 0.0), 3) for p in ("rollout", *phases)}
    figures["other"] = round(step["step"] - sum(step.get(p, 0.0) for p in ("rollout", *phases)), 3)
    figures["step"] = round(step["step"], 3)
    figures["samples"] = len(samples)
    figures["tokens"] = sum(n for n, _ in samples)
    figures["longest_sample"] = max(n for n, _ in samples)
    figures["padding_share"] = round(1 - real / padded_tokens, 4) if padded_tokens else 0.0
    figures["training_tokens_per_s"] = round(figures["tokens"] / training_s, 1) if training_s else 0.0
    tflops = flops / training_s / 1e12 if training_s else 0.0
    figures["model_tflops"] = significant(tflops)
    figures["mfu_measured_peak"] = significant(tflops / peak_tflops)
    figures["mfu_datasheet"] = significant(tflops / DATASHEET_BF16_TFLOPS)
    return figures


def memory(sizes: Sizes, device: torch.device, **_) -> dict:
    tokenizer = word_tokenizer(sizes.model["vocab_size"])
    model = random_model(sizes, device, tokenizer)
    prompt_tokens, completion_tokens = sizes.memory_sample
    one_word = [{"role": "user", "content": "w9"}]
    overhead = len(tokenizer.apply_chat_template(one_word, add_generation_prompt=True, return_dict=False)) - 1
    words = " ".join(f"w{10 + i}" for i in range(prompt_tokens - overhead))
    rows = [{"prompt": [{"role": "user", "content": words}]}]
    samples = sizes.token_bound // (prompt_tokens + completion_tokens)
    trainer = MultiAgentGRPOTrainer(
        model=model,
        workflow=SingleAgent(template="raw"),
        reward_funcs=token_parity_reward,
        args=paper_config(
            sizes,
            num_generations=samples,
            per_device_train_batch_size=samples,
            gradient_accumulation_steps=1,
            max_steps=1,
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora(sizes),
        rollout_backend=DrawnLengths(tokenizer, {"shared": (completion_tokens, completion_tokens)}),
    )
    clock = PhaseClock(device)
    clocked_trainer(trainer, clock)
    cuda = device.type == "cuda"
    marks = {}
    loss_forward = trainer.per_token_logps_and_entropies

    def measured(*args, **kwargs):
        if torch.is_grad_enabled() and cuda:
            torch.cuda.synchronize()
            marks["resident_gib"] = torch.cuda.memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        return loss_forward(*args, **kwargs)

    trainer.per_token_logps_and_entropies = measured
    trainer.train()
    step = clock.steps[0]
    real, padded_tokens = step["forward_tokens"]
    figures = {
        "micro_batch": f"{samples} samples x ({prompt_tokens} + {completion_tokens}) tokens",
        "tokens": real,
        "padded_tokens": padded_tokens,
        "forward_s": round(step.get("loss_forward", 0.0), 3),
        "backward_s": round(step.get("backward", 0.0), 3),
    }
    if cuda:
        figures["resident_before_gib"] = round(marks["resident_gib"], 2)
        figures["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        figures["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return figures


def decode(sizes: Sizes, device: torch.device, rounds: int = 2, **_) -> dict:
    tokenizer = word_tokenizer(sizes.model["vocab_size"])
    model = random_model(sizes, device, tokenizer)
    trainer = MultiAgentGRPOTrainer(
        model=model,
        workflow=EvalOpt(max_iterations=1, task="math"),
        reward_funcs=token_parity_reward,
        args=paper_config(sizes, policy_sharing="isolated", num_generations=2, per_device_train_batch_size=2),
        train_dataset=Dataset.from_list(prompt_rows(1)),
        processing_class=tokenizer,
        peft_config=lora(sizes),
    )
    ours = build_backend(trainer.args, trainer.backend_context())
    half = 8 if not sizes.smoke else 2

    def words(i: int) -> str:
        return " ".join(f"w{100 + (i * 7 + j) % 900}" for j in range(sizes.decode_prompt))

    new_tokens = {"max_tokens": sizes.decode_tokens}
    requests = [
        GenerationRequest(adapter, [{"role": "user", "content": words(i)}], generation_kwargs=new_tokens)
        for adapter in ("generator", "evaluator")
        for i in range(half)
    ]
    config = ours.config_for(requests[0].generation_kwargs)
    prompts = ours.prompt_ids_of(requests)
    input_ids, attention_mask = padded(prompts, tokenizer.pad_token_id, side="left")
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    names = [r.adapter for r in requests]
    peft_model = trainer.model
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def run_ours() -> tuple[float, int]:
        sync()
        began = time.perf_counter()
        results = ours.generate(requests)
        sync()
        return time.perf_counter() - began, max(len(r.completion_ids) for r in results)

    def run_plain() -> tuple[float, int]:
        peft_model.eval()
        sync()
        began = time.perf_counter()
        with torch.no_grad():
            output = peft_model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=config, adapter_names=names
            )
        sync()
        return time.perf_counter() - began, output.size(1) - input_ids.size(1)

    run_ours(), run_plain()  # warm-up: kernels, caches, the allocator
    times = {"ours": [], "plain": []}
    for r in range(rounds):
        order = ("ours", "plain") if r % 2 == 0 else ("plain", "ours")
        for name in order:
            seconds, steps = run_ours() if name == "ours" else run_plain()
            times[name].append(1000 * seconds / max(steps, 1))
    ours_ms, plain_ms = (sorted(times[k])[len(times[k]) // 2] for k in ("ours", "plain"))
    return {
        "requests": f"{len(requests)} calls, adapters {sorted(set(names))} mixed, {sizes.decode_prompt}-token prompts",
        "new_tokens": sizes.decode_tokens,
        "ours_ms_per_step": [round(t, 2) for t in times["ours"]],
        "plain_ms_per_step": [round(t, 2) for t in times["plain"]],
        "ratio_plain_over_ours": round(plain_ms / ours_ms, 3),
    }


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
    runs = dict(peak=peak, training=training, memory=memory, decode=decode, recipes=recipes, vllm=vllm)
    failed = []
    for name in sections:
        began = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            figures = runs[name](
                sizes, device, steps=args.steps, episodes=args.episodes, max_iterations=args.max_iterations
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
