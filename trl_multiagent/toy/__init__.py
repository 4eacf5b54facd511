"""The toy models shipped with trl-multiagent, loaded offline by name.

``toy``: a small Qwen3 (3.7M parameters) that follows every built-in role on arithmetic and toy_code problems.
``toy-judge``: a smaller Qwen3 (0.5M parameters, its own 1k-token tokenizer) that plays the evaluator on arithmetic,
for the two-model preset (``role_models``). ``toy-search``: a Qwen3 of ``toy``'s size trained on the verification-easy
``mod_search`` family only (its own tokenizer), for the toy grid's third family. All three are built by
``scripts/build_toy_model.py``.

``resolve_model_name(name)`` is the folder of the packaged weights and tokenizer for these names; any other name
passes through. ``model_name(path)`` turns such a folder back into its name, so saved runs name their base models
portably.
"""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
TOY_MODEL_NAME = "toy"
TOY_MODEL_DIR = os.path.join(_HERE, "model")
TOY_JUDGE_NAME = "toy-judge"
TOY_JUDGE_DIR = os.path.join(_HERE, "judge")
TOY_SEARCH_NAME = "toy-search"
TOY_SEARCH_DIR = os.path.join(_HERE, "search")
SHIPPED_MODELS = {TOY_MODEL_NAME: TOY_MODEL_DIR, TOY_JUDGE_NAME: TOY_JUDGE_DIR, TOY_SEARCH_NAME: TOY_SEARCH_DIR}


def resolve_model_name(name: str) -> str:
    """The packaged folder of a shipped toy model (``SHIPPED_MODELS``); any other model name or path unchanged."""
    if name not in SHIPPED_MODELS:
        return name
    folder = SHIPPED_MODELS[name]
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise FileNotFoundError(
            f"The {name} model is missing from {folder}. Rebuild it with `python scripts/build_toy_model.py` (see its "
            "docstring), or reinstall trl-multiagent so its package data is included."
        )
    return folder


def model_name(path: str) -> str:
    """The shipped name for a packaged toy model's folder (wherever the package is installed); else ``path``."""
    for name, folder in SHIPPED_MODELS.items():
        if os.path.isdir(path) and os.path.isdir(folder) and os.path.samefile(path, folder):
            return name
    return path
