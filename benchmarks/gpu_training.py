"""The GPU suite's training sections: the paper's Eval-Opt step at the paper's lengths (the first step apart from the
warm ones; each warm step's split, what each phase ran, MFU and hardware FLOP utilisation; median and spread over the
warm steps) and the 51,200-token micro-batch repeated (time, utilisation, memory)."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from common import prompt_rows, token_parity_reward
from datasets import Dataset
from drawn_lengths import DrawnLengths, word_tokenizer
from executed_work import ExecutedWork
from gpu_clock import PhaseClock, ProfiledStep, clocked_trainer, optimizer_clock
from gpu_setup import Sizes, lora, paper_config, random_model, significant
from kernel_groups import grouped_seconds, lora_ranges
from model_flops import DecoderShape, backward_flops, forward_flops

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer, SingleAgent

PHASES = ("logps_before_update", "loss_forward", "backward", "optimizer")
SUMMARISED = ("step", "training_s", "mfu_datasheet", "mfu_measured_peak", "hfu_datasheet", "hfu_measured_peak")
SUMMARISED += ("executed_over_model_flops", "padding_share")


def training(
    sizes: Sizes, device: torch.device, *, steps: int, episodes: int, max_iterations: int, peaks: dict, **_
) -> dict:
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
    clock = measured_trainer(trainer, device)
    hooks = optimizer_clock(clock)
    try:
        trainer.train()
    finally:
        for hook in hooks:
            hook.remove()
        clock.work.remove()
    report = {"first_step": step_figures(clock.steps[0], shape, sizes, peaks)}
    warm = [step_figures(s, shape, sizes, peaks) for s in clock.steps[1:]]
    report["warm_steps"] = warm
    report["warm_summary"] = summary(warm)
    report["lora_dtypes"] = clock.work.lora_dtypes()
    report["gradient_checkpointing_enabled"] = clock.work.checkpointing_enabled()
    report["adapters"] = list(trainer._updates.installed.adapter_names)
    return report


def measured_trainer(trainer, device: torch.device) -> PhaseClock:
    """The trainer with its phases timed and what each runs recorded (on this instance only)."""
    clock = PhaseClock(device)
    clocked_trainer(trainer, clock)
    clock.work = ExecutedWork(trainer.model, lambda: clock.phase)
    return clock


def summary(steps: list[dict]) -> dict:
    """Median, lowest and highest of the main figures over ``steps`` (the warm ones)."""
    figures = {}
    for key in SUMMARISED:
        values = [s[key] for s in steps if s.get(key) is not None]
        if values:
            figures[key] = {"median": significant(statistics.median(values)), "min": min(values), "max": max(values)}
    figures["steps"] = len(steps)
    return figures


def utilisation(figures: dict, *, model_flops: float, executed_flops: float, seconds: float, peaks: dict) -> None:
    """MFU (model FLOPs) and hardware FLOP utilisation (executed FLOPs) against the datasheet's and the measured
    peak, added to ``figures``."""
    for label, flops in (("mfu", model_flops), ("hfu", executed_flops)):
        tflops = flops / seconds / 1e12 if seconds else 0.0
        figures[f"{'model' if label == 'mfu' else 'hardware'}_tflops"] = significant(tflops)
        datasheet = peaks.get("datasheet_tflops")
        figures[f"{label}_datasheet"] = significant(tflops / datasheet) if datasheet else None
        figures[f"{label}_measured_peak"] = significant(tflops / peaks["measured_tflops"])
    figures["executed_over_model_flops"] = significant(executed_flops / model_flops) if model_flops else None


def step_figures(step: dict, shape: DecoderShape, sizes: Sizes, peaks: dict) -> dict:
    samples = step["samples"]
    # Model FLOPs: one forward and one backward of each sample, the work the update needs; a log-prob forward before
    # the update, padding and recompute are executed work only (hardware FLOPs).
    model_flops = sum(
        forward_flops(shape, tokens=n, completion=c, lora_rank=sizes.lora_rank)
        + backward_flops(shape, tokens=n, completion=c, lora_rank=sizes.lora_rank)
        for n, c in samples
    )
    training_s = sum(step.get(p, 0.0) for p in PHASES)
    work = step.get("work", {})
    figures = {p: round(step.get(p, 0.0), 3) for p in ("rollout", *PHASES)}
    figures["other"] = round(step["step"] - sum(step.get(p, 0.0) for p in ("rollout", *PHASES)), 3)
    figures["step"] = round(step["step"], 3)
    figures["training_s"] = round(training_s, 3)
    figures["samples"] = len(samples)
    figures["tokens"] = sum(n for n, _ in samples)
    figures["longest_sample"] = max(n for n, _ in samples)
    real = sum(w.real_tokens for w in work.values())
    computed = real + sum(w.padded_tokens for w in work.values())
    figures["padding_share"] = round(1 - real / computed, 4) if computed else 0.0
    figures["training_tokens_per_s"] = round(figures["tokens"] / training_s, 1) if training_s else 0.0
    figures["model_tflop"] = significant(model_flops / 1e12)
    executed = sum(w.executed_flops() for w in work.values())
    utilisation(figures, model_flops=model_flops, executed_flops=executed, seconds=training_s, peaks=peaks)
    # Where the executed FLOPs beyond the model's went: the log-prob forward before the update, recompute, padding,
    # attention beyond each sample's causal triangle (TFLOP; the extra forward's padding sits in two of these)
    extra = work["logps_before_update"].executed_flops() if "logps_before_update" in work else 0.0
    waste = {"extra_forwards": extra / 1e12}
    for phase_work in work.values():
        for kind, tflop in phase_work.waste().items():
            waste[kind] = waste.get(kind, 0.0) + tflop
    figures["waste_tflop"] = {kind: round(tflop, 4) for kind, tflop in waste.items()}
    figures["phases"] = {phase: w.figures() for phase, w in work.items()}
    return figures


def micro_batch(
    sizes: Sizes, device: torch.device, *, peaks: dict, repeats: int, profile_dir: Path | None = None, **_
) -> dict:
    """One micro-batch of exactly the paper's token bound (10 samples of 1,024 + 4,096 tokens), forward and backward
    through the trainer's loss, ``repeats`` times after a first (cold) one: time, MFU, HFU, peak memory."""
    tokenizer = word_tokenizer(sizes.model["vocab_size"])
    model = random_model(sizes, device, tokenizer)
    shape = DecoderShape.of(model.config)
    prompt_tokens, completion_tokens = sizes.memory_sample
    one_word = [{"role": "user", "content": "w9"}]
    overhead = len(tokenizer.apply_chat_template(one_word, add_generation_prompt=True, return_dict=False)) - 1
    words = " ".join(f"w{10 + i}" for i in range(prompt_tokens - overhead))
    rows = [{"prompt": [{"role": "user", "content": words}]}]
    samples = sizes.token_bound // (prompt_tokens + completion_tokens)
    steps = 1 + repeats + bool(profile_dir)  # a profiled step, if any, is timed apart from the repeats
    trainer = MultiAgentGRPOTrainer(
        model=model,
        workflow=SingleAgent(template="raw"),
        reward_funcs=token_parity_reward,
        args=paper_config(
            sizes,
            num_generations=samples,
            per_device_train_batch_size=samples,
            gradient_accumulation_steps=1,
            max_steps=steps,
        ),
        train_dataset=Dataset.from_list(rows * steps),
        processing_class=tokenizer,
        peft_config=lora(sizes),
        rollout_backend=DrawnLengths(tokenizer, {"shared": (completion_tokens, completion_tokens)}),
    )
    clock = measured_trainer(trainer, device)
    cuda = device.type == "cuda"
    marks = {}
    loss_forward = trainer._logps_and_entropies

    def measured(*args, **kwargs):
        if torch.is_grad_enabled() and cuda and "resident_gib" not in marks:
            torch.cuda.synchronize()
            marks["resident_gib"] = torch.cuda.memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        return loss_forward(*args, **kwargs)

    trainer._logps_and_entropies = measured
    profiled, handles = None, []
    if profile_dir:
        profiled = ProfiledStep(device, steps, profile_dir / "profile-micro-batch.txt")
        trainer.add_callback(profiled)
        handles = lora_ranges(trainer.model)
    try:
        trainer.train()
    finally:
        clock.work.remove()
        for handle in handles:
            handle.remove()
    timed = clock.steps[1 : 1 + repeats]
    per_step = []
    for step in timed:
        work = step["work"]
        seconds = sum(step.get(p, 0.0) for p in PHASES)
        flops = sum(
            forward_flops(shape, tokens=n, completion=c, lora_rank=sizes.lora_rank)
            + backward_flops(shape, tokens=n, completion=c, lora_rank=sizes.lora_rank)
            for n, c in step["samples"]
        )
        figures = {p: round(step.get(p, 0.0), 3) for p in PHASES}
        figures["training_s"] = round(seconds, 3)
        executed = sum(w.executed_flops() for w in work.values())
        utilisation(figures, model_flops=flops, executed_flops=executed, seconds=seconds, peaks=peaks)
        per_step.append(figures)
    last = timed[-1]
    figures = {
        "micro_batch": f"{samples} samples x ({prompt_tokens} + {completion_tokens}) tokens",
        "tokens": sum(n for n, _ in last["samples"]),
        "cold_step": {p: round(clock.steps[0].get(p, 0.0), 3) for p in PHASES},
        "repeats": per_step,
        "summary": summary(per_step),
        "phases": {phase: w.figures() for phase, w in last["work"].items()},
        "lora_dtypes": clock.work.lora_dtypes(),
    }
    if cuda:
        figures["resident_before_gib"] = round(marks["resident_gib"], 2)
        figures["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        figures["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    if profiled is not None and profiled.done is not None:
        figures["kernel_groups"] = grouped_seconds(
            profiled.done, vocab=shape.vocab, lora_rank=sizes.lora_rank, on_device=cuda
        )
    return figures
