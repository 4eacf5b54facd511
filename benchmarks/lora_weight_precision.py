"""What bf16 LoRA weights would cost an AdamW update, against the fp32 weights the trainer keeps.

    python benchmarks/lora_weight_precision.py

A count, not a timing (no model runs, the same numbers on any machine): one LoRA pair of Qwen3-1.7B's shape at the
paper preset's rank (`lora_A` 64 x 2048 as PEFT initialises it, `lora_B` 2048 x 64 at zero), ten AdamW steps on fixed
random gradients, once with fp32 weights and once with bf16 weights (their optimizer state then bf16 too), at the
paper preset's learning rate (2e-5) and at the CPU preset's (1e-3). Per weight matrix: the relative difference of the
bf16 update from the fp32 one, and the share of weights whose bf16 update rounded to nothing. RESULT: the share of
`lora_A` that never moved at the paper's rate. Why the trainer keeps fp32 LoRA weights on a bf16 base and skips only
the input casts autocast undoes (docs/scaling.md, "The LoRA layers' dtype").
"""

from __future__ import annotations

import argparse

import torch

RANK, HIDDEN, STEPS = 64, 2048, 10


def updates(dtype: torch.dtype, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each weight's change after ``STEPS`` AdamW steps, held in ``dtype``, read in fp32."""
    generator = torch.Generator().manual_seed(0)
    a = torch.empty(RANK, HIDDEN)
    torch.nn.init.kaiming_uniform_(a, a=5**0.5, generator=generator)  # PEFT's lora_A initialisation
    b = torch.zeros(HIDDEN, RANK)
    grad_a, grad_b = (torch.randn(t.shape, generator=generator) * 1e-3 for t in (a, b))
    weights = [torch.nn.Parameter(t.clone().to(dtype)) for t in (a, b)]
    start = [w.detach().float().clone() for w in weights]
    optimizer = torch.optim.AdamW(weights, lr=lr, weight_decay=0.0)
    for _ in range(STEPS):
        for weight, grad in zip(weights, (grad_a, grad_b), strict=True):
            weight.grad = grad.to(dtype)
        optimizer.step()
    return tuple(w.detach().float() - s for w, s in zip(weights, start, strict=True))


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    lost_at_paper_rate = None
    for lr in (2e-5, 1e-3):
        full, half = updates(torch.float32, lr), updates(torch.bfloat16, lr)
        for name, ref, low in zip(("lora_A", "lora_B"), full, half, strict=True):
            off = float((low - ref).norm() / ref.norm())
            lost = float(((low == 0) & (ref != 0)).float().mean())
            print(f"lr {lr:g} {name}: bf16 update off by {off:.3f} of the fp32 one; weights unmoved {lost:.3f}")
            if lr == 2e-5 and name == "lora_A":
                lost_at_paper_rate = lost
    print(f"RESULT lora_weight_precision value={lost_at_paper_rate:.3f}")


if __name__ == "__main__":
    main()
