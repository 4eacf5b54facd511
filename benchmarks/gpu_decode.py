"""The GPU suite's decode section: our transformers rollout backend against plain transformers ``generate`` on the
same PEFT model and the same requests, alternated; and the operations each dispatches per call."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from common import prompt_rows, token_parity_reward
from datasets import Dataset
from drawn_lengths import word_tokenizer
from gpu_clock import DeviceOps, kernel_profiler, write_profile
from gpu_setup import Sizes, lora, paper_config, random_model

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.from_config import build_backend
from trl_multiagent.rollout.padding import padded


def decode(sizes: Sizes, device: torch.device, rounds: int = 2, profile_dir: Path | None = None, **_) -> dict:
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
    ours = build_backend(trainer.args, trainer._backend_context())
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
    if profile_dir:
        for name, run in (("ours", run_ours), ("plain", run_plain)):
            with kernel_profiler(device) as profiler:
                run()
            write_profile(profiler, device, profile_dir / f"profile-decode-{name}.txt")
    times = {"ours": [], "plain": []}
    for r in range(rounds):
        order = ("ours", "plain") if r % 2 == 0 else ("plain", "ours")
        for name in order:
            seconds, steps = run_ours() if name == "ours" else run_plain()
            times[name].append(1000 * seconds / max(steps, 1))
    ours_ms, plain_ms = (statistics.median(times[k]) for k in ("ours", "plain"))
    short = [replace(r, generation_kwargs={"max_tokens": 4}) for r in requests]
    short_config = ours.config_for(short[0].generation_kwargs)
    with DeviceOps() as ours_ops:
        ours.generate(short)
    with DeviceOps() as plain_ops, torch.no_grad():
        peft_model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=short_config, adapter_names=names
        )
    return {
        "requests": f"{len(requests)} calls, adapters {sorted(set(names))} mixed, {sizes.decode_prompt}-token prompts",
        "new_tokens": sizes.decode_tokens,
        "ours_ms_per_step": [round(t, 2) for t in times["ours"]],
        "plain_ms_per_step": [round(t, 2) for t in times["plain"]],
        "ratio_plain_over_ours": round(plain_ms / ours_ms, 3),
        "ops_per_call_of_4_tokens": {"ours": ours_ops.ops, "plain": plain_ops.ops},
        "tensors_from_python_data": {"ours": ours_ops.from_python, "plain": plain_ops.from_python},
    }
