"""Model FLOPs of a LoRA training step on a Qwen3-shaped decoder: what MFU divides by the time.

Counted per sample of ``n`` tokens (prompt + completion) of which ``c`` are completion tokens, in multiply-adds x 2:

- forward: every linear layer of every decoder layer, ``2 n P_layer``, with ``P_layer`` = q, k, v, o, gate, up, down
  weights; the LoRA adapter on each of them, ``2 n P_lora`` (``r (in + out)`` per linear); causal attention,
  ``2 n^2 h d`` per layer (scores and weighted values, each over the ``n (n + 1) / 2 ~ n^2 / 2`` query-key pairs a
  causal mask keeps, ``h d`` = query heads x head size); the LM head on the completion positions only,
  ``2 c H V`` (TRL computes logits for those alone).
- backward, base frozen: the base needs activation gradients only (no weight gradients), as many FLOPs as its
  forward; LoRA needs both, twice its forward; attention's backward is twice its forward; the frozen LM head, once.

So a frozen-base backward costs about one forward, not two: a LoRA step of forward + backward is ~4 n P FLOPs per
token, against full fine-tuning's ~6 n P. Recomputation under gradient checkpointing is hardware work, not model work,
and is left out (MFU, not HFU). Embedding lookups, norms, activations and softmax are left out (well under 1%).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config) -> DecoderShape:
        """The shape of a transformers Qwen3 (or Llama-like) config."""
        return cls(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
        )

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer: q, k, v, o, gate, up, down."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def layer_params(self) -> int:
        return sum(a * b for a, b in self.linears())

    def lora_params(self, rank: int) -> int:
        """Parameters of one adapter of rank ``rank`` on every linear layer of one decoder layer."""
        return sum(rank * (a + b) for a, b in self.linears())


def forward_flops(shape: DecoderShape, *, tokens: int, completion: int, lora_rank: int) -> float:
    """FLOPs of one forward of one sample (``tokens`` in all, ``completion`` of them scored)."""
    per_layer = 2 * tokens * (shape.layer_params() + shape.lora_params(lora_rank))
    per_layer += 2 * tokens**2 * shape.heads * shape.head_dim  # causal: half of the 4 n^2 h d of a full mask
    return shape.layers * per_layer + 2 * completion * shape.hidden * shape.vocab


def backward_flops(shape: DecoderShape, *, tokens: int, completion: int, lora_rank: int) -> float:
    """FLOPs of the backward of one sample with the base frozen and the LoRA adapter trained."""
    base = 2 * tokens * shape.layer_params()  # activation gradients only
    lora = 2 * 2 * tokens * shape.lora_params(lora_rank)  # activation and weight gradients
    attention = 2 * 2 * tokens**2 * shape.heads * shape.head_dim
    return shape.layers * (base + lora + attention) + 2 * completion * shape.hidden * shape.vocab
