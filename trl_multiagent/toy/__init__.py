"""The toy model shipped with trl-multiagent: a small Qwen3 that follows every built-in role on arithmetic.

``resolve_model_name("toy")`` is the folder of the packaged weights and tokenizer; any other name passes through.
``model_name(path)`` turns that folder back into ``"toy"``, so saved runs name their base model portably.
"""

from __future__ import annotations

import os

TOY_MODEL_NAME = "toy"
TOY_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")


def resolve_model_name(name: str) -> str:
    """``TOY_MODEL_DIR`` for ``"toy"``; any other model name or path unchanged."""
    if name != TOY_MODEL_NAME:
        return name
    if not os.path.isfile(os.path.join(TOY_MODEL_DIR, "config.json")):
        raise FileNotFoundError(
            f"The toy model is missing from {TOY_MODEL_DIR}. Rebuild it with `python scripts/build_toy_model.py`, "
            "or reinstall trl-multiagent so its package data is included."
        )
    return TOY_MODEL_DIR


def model_name(path: str) -> str:
    """``"toy"`` for the packaged toy model's folder (wherever the package is installed); anything else unchanged."""
    is_toy = os.path.isdir(path) and os.path.isdir(TOY_MODEL_DIR) and os.path.samefile(path, TOY_MODEL_DIR)
    return TOY_MODEL_NAME if is_toy else path
