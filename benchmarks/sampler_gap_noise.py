"""The sampler gap's numerical noise: vLLM's sampled log-probs vs the trainer's (transformers + PEFT) on the same
weights, on the toy model, per role; what `adapter_mismatch_gap`'s defaults are set from (needs `vllm`, see .ci/run).

    python benchmarks/sampler_gap_noise.py float32
    python benchmarks/sampler_gap_noise.py bfloat16
    python benchmarks/sampler_gap_noise.py float32 --questions 4 --max-tokens 8   # the smallest run (CI)

The toy Qwen3 (trl_multiagent/toy) with two LoRA role adapters (r=16 on every linear layer, B ~ N(0, 0.02)), loaded in
the given dtype by both sides; vLLM (colocated, CPU) samples 48 arithmetic questions per role at temperature 0.7, at
most 80 tokens; a transformers forward of the same weights scores the sampled tokens (logits cast to fp32, divided
by the temperature). Printed per role: mean and max |trainer - sampler| log-prob per token and the std of the
sequence-level ratio exp(mean gap), for the role's own adapter (noise), for the other role's adapter (a swapped slot)
and, for the generator, for weights one optimizer step newer than vLLM's (every LoRA weight moved by 1e-3, Adam's
first step at lr 1e-3: a missed sync).

Measured 2026-12-01 on the tree of commit 7d8195c plus the provenance stamps, vLLM 0.32 CPU build, torch 2.13 CPU,
2 cores shared with other jobs (mean gap per token; generator / evaluator):
    float32   noise 6.1e-7 / 6.8e-7 (max 1.8e-5, ratio std 4.3e-7 / 6.4e-7); swapped 0.11 / 0.14 (max 5.4);
              one step stale 7.1e-3 (max 0.19)
    bfloat16  noise 7.0e-3 / 8.4e-3 (max 0.24, ratio std 5.7e-3 / 4.3e-3); swapped 0.14 / 0.12 (max 5.1);
              one step stale 1.0e-2 (max 0.24)
A first run with other question wording ("Put the answer in \boxed{}") gave fp32 noise 4.6e-7 / 4.2e-7, swapped
0.10 / 0.10, stale 3.1e-3; bf16 noise 4.8e-3 / 6.6e-3, swapped 0.095 / 0.11, stale 9.5e-3.
"""

from __future__ import annotations

import argparse
import copy
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import trl_multiagent.toy as toy  # noqa: E402
from trl_multiagent.adapters.routing import AdapterRouter, adapter_parameters  # noqa: E402
from trl_multiagent.rollout.backends.base import GenerationRequest  # noqa: E402
from trl_multiagent.rollout.backends.vllm_backend import VLLMBackend  # noqa: E402

TEMPERATURE = 0.7
ROLES = ("generator", "evaluator")


def trainer_logps(model, router, prompt: list[int], completion: list[int], adapter: str) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad(), router.route([adapter]):
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / TEMPERATURE
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def gap_stats(model, router, results, adapter: str) -> dict[str, float]:
    gaps = [
        trainer_logps(model, router, r.prompt_ids, r.completion_ids, adapter) - torch.tensor(r.sampling_logprobs)
        for r in results
    ]
    flat = torch.cat(gaps).abs()
    ratios = torch.stack([g.mean() for g in gaps]).exp()
    return {"mean": flat.mean().item(), "max": flat.max().item(), "ratio_std": ratios.std().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dtype", nargs="?", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--questions", type=int, default=48, help="arithmetic questions sampled per role")
    parser.add_argument("--max-tokens", type=int, default=80, help="most tokens sampled per question")
    args = parser.parse_args()
    dtype = args.dtype
    torch.set_num_threads(1)
    path = os.path.join(os.path.dirname(toy.__file__), "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    model = get_peft_model(base, copy.deepcopy(lora), adapter_name=ROLES[0])
    model.add_adapter(ROLES[1], copy.deepcopy(lora))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_((torch.randn(param.shape, generator=generator) * 0.02).to(param.dtype))
    model.eval()
    router = AdapterRouter(model)
    sampling = dict(max_tokens=args.max_tokens, temperature=TEMPERATURE)
    backend = VLLMBackend(
        path,
        tokenizer,
        ROLES,
        lora_rank=16,
        sampling=sampling,
        eos_token_ids=[tokenizer.eos_token_id],
        dtype=dtype,
        enforce_eager=True,
        seed=0,
    )
    backend.sync_adapters(model)
    questions = [
        [{"role": "user", "content": f"What is {i} + {3 * i % 17}? Answer in \\boxed{{}}."}]
        for i in range(args.questions)
    ]
    report = {}
    for role, other in (ROLES, ROLES[::-1]):
        results = backend.generate([GenerationRequest(role, q) for q in questions])
        report[role] = {
            "noise": gap_stats(model, router, results, role),
            "swapped": gap_stats(model, router, results, other),
        }
    newer = copy.deepcopy(model)
    with torch.no_grad():
        for param in adapter_parameters(newer, ROLES[0]).values():
            param.add_((torch.sign(torch.randn(param.shape, generator=generator)) * 1e-3).to(param.dtype))
    results = backend.generate([GenerationRequest(ROLES[0], q) for q in questions])
    report[ROLES[0]]["one_step_stale"] = gap_stats(newer, AdapterRouter(newer), results, ROLES[0])
    print(json.dumps({dtype: report}, indent=1))


if __name__ == "__main__":
    main()
