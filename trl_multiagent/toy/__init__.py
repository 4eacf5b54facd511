"""The toy models shipped with trl-multiagent, loaded offline by name.

``toy``: a small Qwen3 (3.7M parameters) that follows every built-in role on arithmetic and toy_code problems.
``toy-judge``: a smaller Qwen3 (0.5M parameters, its own 1k-token tokenizer) that plays the evaluator on arithmetic,
for the two-model preset (``role_models``). ``toy-search``: a Qwen3 of ``toy``'s size trained on the verification-easy
``mod_search`` family only (its own tokenizer), for the toy grid's third family. All three are built by
``scripts/build_toy_model.py``.

Importing this package registers the three names with the package's model-name registry (``common/model_names.py``),
which imports it the first time a name is looked up: ``resolve_model_name("toy")`` is the folder of the packaged
weights and tokenizer.
"""

from __future__ import annotations

import os

from ..common.deprecation import moved_names
from ..common.model_names import register_model_name

_HERE = os.path.dirname(os.path.abspath(__file__))
TOY_MODEL_NAME = "toy"
TOY_MODEL_DIR = os.path.join(_HERE, "model")
TOY_JUDGE_NAME = "toy-judge"
TOY_JUDGE_DIR = os.path.join(_HERE, "judge")
TOY_SEARCH_NAME = "toy-search"
TOY_SEARCH_DIR = os.path.join(_HERE, "search")
SHIPPED_MODELS = {TOY_MODEL_NAME: TOY_MODEL_DIR, TOY_JUDGE_NAME: TOY_JUDGE_DIR, TOY_SEARCH_NAME: TOY_SEARCH_DIR}

for _name, _folder in SHIPPED_MODELS.items():
    register_model_name(
        _name,
        _folder,
        if_missing="Rebuild it with `python scripts/build_toy_model.py` (see its docstring), or reinstall "
        "trl-multiagent so its package data is included.",
    )

__all__ = [
    "SHIPPED_MODELS",
    "TOY_JUDGE_DIR",
    "TOY_JUDGE_NAME",
    "TOY_MODEL_DIR",
    "TOY_MODEL_NAME",
    "TOY_SEARCH_DIR",
    "TOY_SEARCH_NAME",
]

# Moved to the model-name registry (0.1.0's recipes imported them from here): they still work until they are
# removed, with a warning.
__getattr__ = moved_names(__name__)
