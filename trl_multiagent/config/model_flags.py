"""TRL's model flags (``ModelConfig``: ``--dtype``, ``--attn_implementation``, ``--model_revision``, ``--load_in_4bit``
...) as they reach the model, the way TRL's own ``trl grpo`` script passes them on.

The recipes parse ``ModelConfig`` with the training settings; ``model_init_kwargs`` turns its flags into the loading
arguments ``GRPOTrainer`` reads from ``args.model_init_kwargs`` (what a config file sets there wins, as in TRL's
script), and TRL's ``get_quantization_config`` turns ``--load_in_4bit`` / ``--load_in_8bit`` into the trainer's
``quantization_config``. The trainer loads every base model with both: its own model, and each base of
``role_models``. k-bit quantization (QLoRA) loads through bitsandbytes, on a CUDA GPU: where it cannot run, the trainer
refuses it when it is built (``check_quantization``) rather than fail inside transformers' loading.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_quantization", "model_init_kwargs"]


def model_init_kwargs(model_args, args) -> dict[str, Any]:
    """The keyword arguments the model is loaded with: ``model_args`` (TRL's ``ModelConfig``) revision, attention
    implementation and dtype, and ``args.trust_remote_code`` (a ``GRPOConfig`` field), under what
    ``args.model_init_kwargs`` sets itself."""
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    return {**kwargs, **(args.model_init_kwargs or {})}


def check_quantization(quantization_config: Any) -> None:
    """Refuse a bitsandbytes k-bit quantization (``load_in_4bit`` or ``load_in_8bit``, as a ``BitsAndBytesConfig``
    or a dict in ``model_init_kwargs``) where it cannot run: without a CUDA GPU, or without bitsandbytes installed.
    Any other quantization, or none, passes."""
    bits = _kbit(quantization_config)
    if bits is None:
        return
    flag = f"--load_in_{bits}bit (load_in_{bits}bit=True)"
    if not torch.cuda.is_available():
        raise ValueError(
            f"{flag} quantizes the base model with bitsandbytes (QLoRA), which trains on a CUDA GPU; this machine has "
            "none. Drop the flag to train LoRA on the unquantized model here, or run on a GPU machine."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(
            f"{flag} quantizes the base model with bitsandbytes (QLoRA), which is not installed: "
            "`pip install bitsandbytes`, or drop the flag."
        )


def _kbit(quantization_config: Any) -> int | None:
    """4 or 8 for a bitsandbytes k-bit config, else None."""
    if quantization_config is None:
        return None
    for bits in (4, 8):
        name = f"load_in_{bits}bit"
        if isinstance(quantization_config, Mapping):
            if quantization_config.get(name):
                return bits
        elif getattr(quantization_config, name, False):
            return bits
    return None
