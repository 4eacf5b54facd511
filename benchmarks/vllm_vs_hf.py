"""Rollout speed of the vLLM backend vs the transformers backend on the same requests (needs `vllm`, see .ci/run).

    python benchmarks/vllm_vs_hf.py
    python benchmarks/vllm_vs_hf.py --requests 64 --completion-length 64 --hidden-size 256 --num-layers 4

A tiny Qwen3 with two LoRA role adapters (random, nonzero B) answers `--requests` chat requests, the adapters
alternating request by request, as one batch: what the rollout engine sends each tick. Every completion is exactly
`--completion-length` tokens (vLLM `min_tokens`, transformers `min_new_tokens`), sampled at temperature 1, so both
backends generate the same token counts; both run fp32 on one thread. Each round runs both backends, in alternating
order; figures are medians over rounds. Reported: generated tokens/s of each, in CPU time (immune to other jobs'
load; wall time beside), their ratio (vLLM / transformers), and the one-off costs vLLM adds: engine start and one
adapter sync (write both adapters to /dev/shm and load them in place).

The default completion length, 256 tokens, is the shortest that resembles real rollouts (the paper's run up to 5120).
On CPU the ratio depends on it: vLLM's paged KV cache pays off on long completions, while its CPU LoRA kernels (a
torch fallback that gathers every token's adapter weights) and per-step scheduling cost more than transformers on
short ones. Measured here (2 shared cores, CPU-time ratios): hidden 64 x 2 layers, 32 requests: 0.62-0.84 at 32
tokens, 0.88 at 128, 1.16 at 256 (three runs; 1.50 once under heavy load); hidden 256 x 4 layers: 0.69 at 64
requests x 64 tokens, 0.95 at 32 x 256.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import nullcontext

# An in-process engine on CPU with 1 GiB of KV cache (NOTES-platform "vLLM on CPU"); read when the engine starts.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from common import median, medians, now, report, since, tiny_model  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402

from trl_multiagent.adapters.routing import AdapterRouter  # noqa: E402
from trl_multiagent.rollout.backends.base import GenerationRequest  # noqa: E402
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend  # noqa: E402
from trl_multiagent.rollout.backends.vllm_backend import VLLMBackend  # noqa: E402

TARGET = 1.0
ADAPTERS = ("generator", "aggregator")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32, help="requests in the batch, adapters alternating")
    parser.add_argument("--completion-length", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)

    tmp = tempfile.TemporaryDirectory()
    model_dir = tiny_model(f"{tmp.name}/model", args.hidden_size, args.num_layers)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear", lora_dropout=0.0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora, adapter_name=ADAPTERS[0])
    model.add_adapter(ADAPTERS[1], lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    model.eval()

    length, eos, pad = args.completion_length, tokenizer.eos_token_id, tokenizer.pad_token_id
    generation_config = GenerationConfig(
        max_new_tokens=length, min_new_tokens=length, do_sample=True, eos_token_id=eos, pad_token_id=pad
    )
    hf = TransformersBackend(lambda: nullcontext(model), tokenizer, AdapterRouter(model), generation_config, [eos])
    start = now()
    sampling = dict(max_tokens=length, min_tokens=length, temperature=1.0)
    vllm = VLLMBackend(
        model_dir, tokenizer, ADAPTERS, args.lora_r, sampling, [eos], dtype="float32", enforce_eager=True, seed=0
    )
    startup = since(start)
    start = now()
    vllm.sync_adapters(model)
    first_sync = since(start)
    start = now()
    vllm.sync_adapters(model)  # the per-step cost: both adapters again, loaded in place
    sync = since(start)

    requests = [
        GenerationRequest(ADAPTERS[i % 2], [{"role": "user", "content": f"What is {i} + {i % 7}?"}])
        for i in range(args.requests)
    ]
    backends = {"transformers": hf, "vllm": vllm}
    for backend in backends.values():  # warm-up
        backend.generate(requests[:4])
    times = {name: [] for name in backends}  # (wall, CPU) seconds per round
    tokens = {name: 0 for name in backends}
    for r in range(args.rounds):
        for name in list(backends) if r % 2 == 0 else list(backends)[::-1]:
            start = now()
            results = backends[name].generate(requests)
            times[name].append(since(start))
            tokens[name] = sum(len(result.completion_ids) for result in results)
    assert tokens["vllm"] == tokens["transformers"] == args.requests * length, tokens

    (hf_wall, hf_cpu), (vllm_wall, vllm_cpu) = medians(times["transformers"]), medians(times["vllm"])
    ratio = median([h[1] / v[1] for h, v in zip(times["transformers"], times["vllm"])])  # CPU time, paired per round
    n = tokens["vllm"]
    rows = [
        ("model", f"tiny Qwen3 hidden={args.hidden_size} layers={args.num_layers}, 2 LoRA adapters r={args.lora_r}"),
        ("workload", f"{args.requests} requests (adapters alternating) x {length} tokens = {n} tokens, one batch"),
        ("transformers s", f"{hf_cpu:.3f} CPU ({hf_wall:.3f} wall), {n / hf_cpu:.0f} tokens/s"),
        ("vllm s", f"{vllm_cpu:.3f} CPU ({vllm_wall:.3f} wall), {n / vllm_cpu:.0f} tokens/s"),
        ("vllm / transformers", f"{ratio:.2f}x tokens/s CPU (median per round; wall {hf_wall / vllm_wall:.2f}x)"),
        ("vllm engine start s", f"{startup[1]:.2f} CPU ({startup[0]:.2f} wall), once"),
        ("vllm adapter sync s", f"{sync[1]:.3f} CPU ({sync[0]:.3f} wall) per step; first {first_sync[0]:.3f} wall"),
    ]
    report("vllm_vs_hf", rows, ratio, ">=", TARGET)
    tmp.cleanup()


if __name__ == "__main__":
    main()
