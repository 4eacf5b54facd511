"""The GPU suite's decode section: our transformers rollout backend (two LoRA adapters mixed in one batch) against
the fastest ways transformers decodes the same requests without adapters, alternated round by round:

- ``plain``: ``generate`` of the base model alone (no PEFT, no adapters), left-padded, dynamic cache;
- ``static_compiled``: the same with a static cache, whose decoding forward ``generate`` compiles with
  ``torch.compile`` (the compiled graphs are counted, so a run that compiled nothing says so);
- ``continuous``: transformers' continuous batching (``generate_batch``): no padding, a paged cache.

And ``ours_base``: our backend with every request routed to the base model (adapters off), which tells the
backend's own cost apart from the adapters' (not one of the three it is compared with).

Every call generates exactly the same number of tokens (``min_new_tokens`` = ``max_new_tokens``), so the figure is
tokens/s over the same work. The base model of the three is the same random model as ours, with the same weights.
Reported: each one's tokens/s per round, median and spread; ours over the fastest (target >= 0.8); and the
operations each call dispatches for 4 tokens, with the tensors made from Python data (each a blocking host-to-device
copy on a GPU).
"""

from __future__ import annotations

import copy
import inspect
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from common import prompt_rows, token_parity_reward
from datasets import Dataset
from drawn_lengths import word_tokenizer
from gpu_clock import DeviceOps, kernel_profiler, write_profile
from gpu_setup import Sizes, lora, paper_config, random_model, significant
from transformers import CompileConfig, ContinuousBatchingConfig

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer
from trl_multiagent.adapters.routing import BASE_MODEL
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.from_config import build_backend
from trl_multiagent.rollout.padding import padded

TARGET = 0.8  # ours over the fastest of the three


def decode(sizes: Sizes, device: torch.device, profile_dir: Path | None = None, **_) -> dict:
    tokenizer = word_tokenizer(sizes.model["vocab_size"])
    trainer = MultiAgentGRPOTrainer(
        model=random_model(sizes, device, tokenizer),
        workflow=EvalOpt(max_iterations=1, task="math"),
        reward_funcs=token_parity_reward,
        args=paper_config(sizes, policy_sharing="isolated", num_generations=2, per_device_train_batch_size=2),
        train_dataset=Dataset.from_list(prompt_rows(1)),
        processing_class=tokenizer,
        peft_config=lora(sizes),
    )
    with torch.no_grad():  # nonzero adapters, so that mixing them changes the outputs as trained ones do
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    ours = build_backend(trainer.args, trainer._backend_context())
    plain = random_model(sizes, device, tokenizer).eval()  # same seed: the same base weights, no PEFT

    def words(i: int) -> str:
        return " ".join(f"w{100 + (i * 7 + j) % 900}" for j in range(sizes.decode_prompt))

    new_tokens = sizes.decode_tokens
    exact = {"max_tokens": new_tokens, "min_new_tokens": new_tokens}
    half = sizes.decode_calls // 2
    requests = [
        GenerationRequest(adapter, [{"role": "user", "content": words(i)}], generation_kwargs=exact)
        for i in range(half)
        for adapter in ("generator", "evaluator")  # the adapters alternate request by request
    ]
    base_requests = [replace(r, adapter=BASE_MODEL) for r in requests]
    config = ours.config_for(requests[0].generation_kwargs)
    prompts = ours.prompt_ids_of(requests)
    input_ids, attention_mask = padded(prompts, tokenizer.pad_token_id, side="left")
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    static_config = copy.deepcopy(config)
    static_config.cache_implementation = "static"
    static_config.disable_compile = False  # TRL's generation config turns compilation off
    static_config.compile_config = CompileConfig(backend=sizes.compile_backend)
    static_config.compile_config._compile_all_devices = device.type != "cuda"  # transformers compiles on GPUs only
    paged = ContinuousBatchingConfig(**sizes.continuous_batching)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def run_ours(reqs=requests) -> int:
        return sum(len(r.completion_ids) for r in ours.generate(reqs))

    def run_generate(generation_config) -> int:
        with torch.no_grad():
            output = plain.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config
            )
        return (output.size(1) - input_ids.size(1)) * output.size(0)

    def run_continuous() -> int:
        extra = {"progress_bar": False} if "progress_bar" in inspect.signature(plain.generate_batch).parameters else {}
        with torch.no_grad():
            outputs = plain.generate_batch(
                prompts, generation_config=config, continuous_batching_config=paged, **extra
            )
        return sum(len(output.generated_tokens) for output in outputs.values())

    runs = {
        "ours": run_ours,
        "ours_base": lambda: run_ours(base_requests),
        "plain": lambda: run_generate(config),
        "static_compiled": lambda: run_generate(static_config),
        "continuous": run_continuous,
    }
    graphs_before = compiled_graphs()
    first_s, failed = {}, {}
    for name, run in list(runs.items()):  # first calls apart: compilation, kernels, caches, the allocator
        try:
            first_s[name] = round(timed(run, sync)[0], 3)
        except Exception as error:  # one path that cannot run here (a compiler, a cache) leaves the others measured
            if name == "ours":
                raise
            failed[name] = f"{type(error).__name__}: {error}"[:1000]
            print(f"decode path {name} failed: {failed[name]}", flush=True)
            del runs[name]
    compiled = compiled_graphs() - graphs_before
    if profile_dir:
        for name in ("ours", "plain"):
            with kernel_profiler(device) as profiler:
                runs[name]()
            write_profile(profiler, device, profile_dir / f"profile-decode-{name}.txt")
    rates = {name: [] for name in runs}
    tokens = {}
    names = list(runs)
    for r in range(sizes.decode_rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            seconds, tokens[name] = timed(runs[name], sync)
            rates[name].append(tokens[name] / seconds)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    fastest = max((n for n in runs if not n.startswith("ours")), key=medians.get)
    short = [replace(r, generation_kwargs={"max_tokens": 4}) for r in requests]
    with DeviceOps() as ours_ops:
        run_ours(short)
    with DeviceOps() as plain_ops:
        run_generate(ours.config_for(short[0].generation_kwargs))
    ratio = medians["ours"] / medians[fastest]
    figures = {
        "requests": f"{len(requests)} calls, {sizes.decode_prompt}-token prompts, {new_tokens} new tokens each, "
        "sampled at 0.7; ours: adapters generator and evaluator mixed in one batch, the others: the base model",
        "tokens_per_call": {name: tokens[name] for name in runs},
        "tokens_per_s": {name: [round(v, 1) for v in values] for name, values in rates.items()},
        "tokens_per_s_median": {name: significant(value) for name, value in medians.items()},
        "tokens_per_s_spread": {name: significant(max(v) - min(v)) for name, v in rates.items()},
        "first_call_s": first_s,
        "compiled_graphs": compiled,
        "compile_backend": sizes.compile_backend,
        "fastest_other": fastest,
        "ours_over_fastest": round(ratio, 3),
        "ours_base_over_fastest": round(medians["ours_base"] / medians[fastest], 3),
        "target": f">= {TARGET}",
        "met": ratio >= TARGET,
        "ops_per_call_of_4_tokens": {"ours": ours_ops.ops, "plain": plain_ops.ops},
        "tensors_from_python_data": {"ours": ours_ops.from_python, "plain": plain_ops.from_python},
    }
    if failed:  # the ratio is then over the paths that ran, and says so
        figures["failed_paths"] = failed
    return figures


def timed(run, sync) -> tuple[float, int]:
    sync()
    began = time.perf_counter()
    tokens = run()
    sync()
    return time.perf_counter() - began, tokens


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
