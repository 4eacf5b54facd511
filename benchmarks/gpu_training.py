"""The GPU suite's training sections: the paper's Eval-Opt step at the paper's lengths (first step apart from warm
ones, each warm step's split and MFU) and one micro-batch at the paper's token bound (memory and time)."""

from __future__ import annotations

from pathlib import Path

import torch
from common import prompt_rows, token_parity_reward
from datasets import Dataset
from drawn_lengths import DrawnLengths, word_tokenizer
from gpu_clock import PhaseClock, ProfiledStep, clocked_trainer, optimizer_clock
from gpu_setup import DATASHEET_BF16_TFLOPS, Sizes, lora, paper_config, random_model, significant
from model_flops import DecoderShape, backward_flops, forward_flops

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer, SingleAgent


def training(
    sizes: Sizes, device: torch.device, *, steps: int, episodes: int, max_iterations: int, peak_tflops: float, **_
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
    clock = PhaseClock(device)
    clocked_trainer(trainer, clock)
    hooks = optimizer_clock(clock)
    try:
        trainer.train()
    finally:
        for hook in hooks:
            hook.remove()
    report = {"first_step": step_figures(clock.steps[0], shape, sizes, peak_tflops)}
    warm = [step_figures(s, shape, sizes, peak_tflops) for s in clock.steps[1:]]
    report["warm_steps"] = warm
    if warm:
        report["warm_mean"] = {k: significant(sum(w[k] for w in warm) / len(warm)) for k in warm[0]}
    report["peak_tflops_used"] = peak_tflops
    report["adapters"] = list(trainer._updates.installed.adapter_names)
    return report


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


def memory(sizes: Sizes, device: torch.device, profile_dir: Path | None = None, **_) -> dict:
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
            max_steps=2 if profile_dir else 1,
        ),
        train_dataset=Dataset.from_list(rows * 2),
        processing_class=tokenizer,
        peft_config=lora(sizes),
        rollout_backend=DrawnLengths(tokenizer, {"shared": (completion_tokens, completion_tokens)}),
    )
    clock = PhaseClock(device)
    clocked_trainer(trainer, clock)
    cuda = device.type == "cuda"
    marks = {}
    loss_forward = trainer._logps_and_entropies

    def measured(*args, **kwargs):
        if torch.is_grad_enabled() and cuda:
            torch.cuda.synchronize()
            marks["resident_gib"] = torch.cuda.memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        return loss_forward(*args, **kwargs)

    trainer._logps_and_entropies = measured
    if profile_dir:
        trainer.add_callback(ProfiledStep(device, 2, profile_dir / "profile-micro-batch.txt"))
    trainer.train()
    step = clock.steps[-1]
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
