"""What the GPU suite's sections share: its sizes (the paper's on a GPU, scaled down for the CPU smoke run), a random
model of Qwen3-1.7B's shape, the paper preset's update as a config, the LoRA adapters."""

from __future__ import annotations

import tempfile

import torch
from peft import LoraConfig
from transformers import Qwen3Config, Qwen3ForCausalLM

from trl_multiagent import MultiAgentGRPOConfig

# Dense bf16 TFLOP/s from NVIDIA's datasheets (without sparsity), by the name torch.cuda.get_device_name() gives. The
# denominator of MFU as PaLM, verl and NeMo quote it; a card not listed here gets MFU against the measured peak only.
DATASHEET_BF16_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.0,  # H100 SXM5
    "NVIDIA H200": 989.0,  # H200 SXM
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
}
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
        self.micro_batch_repeats = 5  # timed after a first (cold) one
        self.matmul = 256 if smoke else 8192
        self.decode_prompt, self.decode_tokens = (24, 8) if smoke else (400, 64)
        self.decode_calls, self.decode_rounds = (4, 3) if smoke else (16, 3)
        # generate_batch's paged cache: on CPU a small one (its default sizes it by the machine's memory); on a GPU
        # half the free memory, TRL's default
        self.continuous_batching = dict(num_blocks=64, max_batch_tokens=256) if smoke else dict(max_memory_percent=0.5)
        self.compile_backend = "eager" if smoke else "inductor"  # the smoke run checks the path, not the compiler
        self.vllm_concurrency = (4, 8) if smoke else (16, 64, 256, 512)
        self.transformers_concurrency = 8 if smoke else 64  # what one generate batch holds at these lengths
        self.vllm_rounds = 1 if smoke else 2


def datasheet_peak(device_name: str) -> float | None:
    """The card's dense bf16 peak from its datasheet, or ``None`` for a card the table does not list."""
    return DATASHEET_BF16_TFLOPS.get(device_name)


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


def lora(sizes: Sizes) -> LoraConfig:
    return LoraConfig(r=sizes.lora_rank, lora_alpha=sizes.lora_rank // 2, target_modules="all-linear", lora_dropout=0)


# ------------------------------------------------------------------------------------------------------- sections


def significant(value: float) -> float:
    return float(f"{value:.4g}")
