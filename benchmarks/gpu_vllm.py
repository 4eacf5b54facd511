"""The GPU suite's vllm section, for a machine that has vLLM: our vLLM backend at Qwen3-1.7B's shape (random weights
saved to disk, two LoRA adapters of rank 64) at concurrencies from 16 to 512 sequences, the seconds of an adapter
sync (both adapters written and loaded in place, as after each optimizer step), and our transformers backend on the
same requests at the concurrencies it can hold in one batch.

Every call generates exactly the same number of tokens (vLLM ``min_tokens``, transformers ``min_new_tokens``), the
adapters alternating request by request; the figure is generated tokens/s, median over rounds.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch
from drawn_lengths import word_tokenizer
from gpu_setup import Sizes, lora, random_model, significant
from peft import get_peft_model
from transformers import GenerationConfig

from trl_multiagent.adapters.routing import AdapterRouter
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend

ADAPTERS = ("generator", "evaluator")


def vllm_section(sizes: Sizes, device: torch.device, **_) -> dict:
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    if device.type == "cpu":  # an in-process engine with a small KV cache (NOTES-platform "vLLM on CPU")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from trl_multiagent.rollout.backends.vllm_backend import VLLMBackend

    folder = tempfile.TemporaryDirectory(prefix="gpu_suite-vllm-")
    tokenizer = word_tokenizer(sizes.model["vocab_size"])
    base = random_model(sizes, device, tokenizer)
    base.save_pretrained(folder.name)
    tokenizer.save_pretrained(folder.name)
    model = get_peft_model(base, lora(sizes), adapter_name=ADAPTERS[0])
    model.add_adapter(ADAPTERS[1], lora(sizes))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    model.eval()

    length = sizes.decode_tokens
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    began = time.perf_counter()
    engine = dict(dtype="float32", enforce_eager=True)  # vLLM on CPU
    if device.type == "cuda":  # half the card (our transformers backend's model shares it), every sequence at once
        engine = dict(dtype="bfloat16", gpu_memory_utilization=0.5, max_num_seqs=max(sizes.vllm_concurrency))
    sampling = dict(max_tokens=length, min_tokens=length, temperature=0.7)
    vllm = VLLMBackend(folder.name, tokenizer, ADAPTERS, sizes.lora_rank, sampling, [eos], seed=0, **engine)
    figures = {"engine_start_s": round(time.perf_counter() - began, 2)}
    syncs = []
    for _ in range(3):  # the first loads both adapters; the next ones replace them, as after each optimizer step
        began = time.perf_counter()
        vllm.sync_adapters(model)
        syncs.append(round(time.perf_counter() - began, 3))
    figures["adapter_sync_s"] = {"first": syncs[0], "then": syncs[1:]}

    generation = GenerationConfig(
        max_new_tokens=length,
        min_new_tokens=length,
        do_sample=True,
        temperature=0.7,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    ours = TransformersBackend(lambda: nullcontext(model), tokenizer, AdapterRouter(model), generation, [eos])

    def requests(n: int) -> list[GenerationRequest]:
        def words(i: int) -> str:
            return " ".join(f"w{100 + (i * 7 + j) % 900}" for j in range(sizes.decode_prompt))

        return [GenerationRequest(ADAPTERS[i % 2], [{"role": "user", "content": words(i)}]) for i in range(n)]

    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    vllm.generate(requests(4))  # warm-up
    ours.generate(requests(2))
    rates: dict[str, dict[int, list[float]]] = {"vllm": {}, "transformers": {}}
    for n in sizes.vllm_concurrency:
        batch = requests(n)
        backends = {"vllm": vllm}
        if n <= sizes.transformers_concurrency:
            backends["transformers"] = ours
        for r in range(sizes.vllm_rounds):
            for name in list(backends) if r % 2 == 0 else list(backends)[::-1]:
                sync()
                began = time.perf_counter()
                results = backends[name].generate(batch)
                sync()
                generated = sum(len(result.completion_ids) for result in results)
                rates[name].setdefault(n, []).append(generated / (time.perf_counter() - began))
    figures["tokens_per_s_median"] = {
        name: {n: significant(statistics.median(v)) for n, v in by_n.items()} for name, by_n in rates.items()
    }
    figures["tokens_per_s"] = {
        name: {n: [round(x, 1) for x in v] for n, v in by_n.items()} for name, by_n in rates.items()
    }
    figures["vllm_over_transformers"] = {
        n: round(statistics.median(rates["vllm"][n]) / statistics.median(v), 3)
        for n, v in rates["transformers"].items()
    }
    figures["requests"] = (
        f"{sizes.decode_prompt}-token prompts, {length} new tokens each, adapters alternating; transformers at "
        f"concurrency <= {sizes.transformers_concurrency}"
    )
    folder.cleanup()
    return figures
