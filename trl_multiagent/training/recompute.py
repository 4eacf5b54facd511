"""Which training forwards recompute their activations in backward (gradient checkpointing), chosen by memory.

TRL's ``gradient_checkpointing`` (on by default) makes every training forward keep only each decoder layer's input
and run the layer again in backward: one more forward of FLOPs for every forward, whether or not its activations
would have fitted. With ``activation_memory_gb`` set, the forwards are cut to at most the tokens whose activations
fit in it (`tokens_that_fit`) and run without checkpointing; only a sample too long to fit alone, in a forward of its
own, still recomputes (where ``gradient_checkpointing`` is on). Unset, every forward does as
``gradient_checkpointing`` says, as in TRL.

The activations a forward keeps grow with its tokens (the rows' widths, padding included, or a packed row's tokens);
`activation_bytes_per_token` estimates them from the model's shape, from above: per decoder layer and token, in the
compute dtype, the two norms' inputs and outputs, the query, key and value projections with their norms and rotary
copies, the attention's output, the MLP's gate, up, activation and product; in float32, each LoRA layer's input
(PEFT casts it to the adapter's dtype when they differ) and its rank-wide intermediate. Not yet checked against a
GPU's allocator: docs/scaling.md says how to read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from ..seams.transformers import checkpointing_off

GB = 1024**3


@dataclass(frozen=True, kw_only=True)
class ActivationShape:
    """What a decoder layer's kept activations depend on."""

    layers: int
    hidden: int
    query: int  # query heads x head size
    key_value: int  # key-value heads x head size
    intermediate: int
    lora_rank: int
    compute_bytes: int  # 2 under bf16 / fp16, 4 in float32
    lora_bytes: int  # the adapters' weights' bytes per value (4: float32 adapters)

    @classmethod
    def of(cls, config, *, lora_rank: int, compute_bytes: int, lora_bytes: int = 4) -> ActivationShape:
        """From a transformers (Qwen3, Llama-like) config."""
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            query=config.num_attention_heads * head,
            key_value=config.num_key_value_heads * head,
            intermediate=config.intermediate_size,
            lora_rank=lora_rank,
            compute_bytes=compute_bytes,
            lora_bytes=lora_bytes,
        )


def activation_bytes_per_token(shape: ActivationShape) -> int:
    """Bytes a forward keeps for backward per token, over every decoder layer, without checkpointing."""
    h, q, kv, i = shape.hidden, shape.query, shape.key_value, shape.intermediate
    kept = shape.compute_bytes * (6 * h + 4 * q + 4 * kv + 4 * i)
    if shape.lora_bytes != shape.compute_bytes:  # PEFT's cast copy of the input of each LoRA linear
        kept += shape.lora_bytes * (5 * h + q + i)
    kept += shape.lora_bytes * 7 * shape.lora_rank  # each LoRA's A output, kept for B's gradient
    return shape.layers * kept


def tokens_that_fit(memory_gb: float, shape: ActivationShape) -> int:
    """The most tokens one forward may hold for its activations to fit in ``memory_gb`` without checkpointing."""
    fit = int(memory_gb * GB) // activation_bytes_per_token(shape)
    if fit < 1:
        raise ValueError(f"`activation_memory_gb={memory_gb}` holds no token's activations; raise it.")
    return fit


def fit_of(model, memory_gb: float | None, *, low_precision: bool) -> int | None:
    """`tokens_that_fit` ``memory_gb`` for a PEFT ``model`` (its shape, its adapters' largest rank and dtype), computed
    in bf16 / fp16 where ``low_precision``; None without ``memory_gb``."""
    if memory_gb is None:
        return None
    lora = next(p for n, p in model.named_parameters() if "lora_A" in n)
    shape = ActivationShape.of(
        model.config,
        lora_rank=max(config.r for config in model.peft_config.values()),
        compute_bytes=2 if low_precision else 4,
        lora_bytes=lora.element_size(),
    )
    return tokens_that_fit(memory_gb, shape)


def recomputes(tokens: int, *, fit: int | None, gradient_checkpointing: bool) -> bool:
    """Whether a training forward of ``tokens`` (padding included) recomputes: never without
    ``gradient_checkpointing``; with it, always when no memory is given (``fit`` None: TRL's), else when its
    activations exceed ``fit`` tokens'."""
    return bool(gradient_checkpointing) and (fit is None or tokens > fit)


@contextmanager
def recompute_off(models: Iterable, gradient_checkpointing_kwargs: dict | None) -> Iterator[None]:
    """Gradient checkpointing off on every one of ``models`` (the bases a forward may run on) while it lasts, and
    back on after with the run's kwargs (TRL's switch, as around its no-grad forwards)."""
    with ExitStack() as stack:
        for model in models:
            stack.enter_context(checkpointing_off(model, gradient_checkpointing_kwargs))
        yield
