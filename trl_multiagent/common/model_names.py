"""Model names that stand for local folders: ``"toy"`` for the shipped toy model, and any name a user registers.

Wherever the package takes a model (the recipes' ``--model_name_or_path``, ``role_models``, a saved run's base model,
``trl-multiagent vllm-serve``), a registered name stands for its folder (``resolve_model_name``), and a registered
folder is saved under its name (``model_name``), so a run trained on ``"toy"`` names its base ``"toy"`` wherever the
package is installed. Any other name (a Hub id, a path) passes through unchanged.

Names are registered with ``register_model_name(name, folder)``: by a user's own code before it trains or loads, and
by the modules of ``REGISTRANTS``, which this registry imports the first time a name is looked up. The toy world
(``trl_multiagent.toy``) is the one registrant shipped: it registers ``toy``, ``toy-judge`` and ``toy-search`` on
import. The core asks this registry only, and never imports the toy itself (tests/package/test_layout.py).
"""

from __future__ import annotations

import importlib
import os

__all__ = ["model_name", "register_model_name", "registered_model_names", "resolve_model_name"]

REGISTRANTS = ("trl_multiagent.toy",)  # modules that register shipped models when imported (read on first lookup)

_folders: dict[str, str] = {}  # name -> folder
_if_missing: dict[str, str] = {}  # name -> how to restore its folder, said when it is gone
_registrants_imported = False


def register_model_name(name: str, folder: str, *, if_missing: str = "") -> None:
    """Make ``name`` stand for ``folder``: a model saved with ``save_pretrained`` (config.json, weights, tokenizer).
    ``if_missing``: how to restore the folder, said when a run asks for ``name`` and the folder is gone. Registering
    a name again for the same folder changes nothing; for another folder it is an error."""
    folder = os.path.abspath(folder)
    registered = _folders.get(name)
    if registered is not None and registered != folder:
        raise ValueError(
            f"Model name {name!r} already stands for {registered}; it cannot also stand for {folder}. Register the "
            "other folder under another name."
        )
    _folders[name] = folder
    _if_missing[name] = if_missing


def registered_model_names() -> dict[str, str]:
    """Every registered name and its folder (the shipped ones included)."""
    _import_registrants()
    return dict(_folders)


def resolve_model_name(name: str) -> str:
    """The folder ``name`` stands for; any other model name or path unchanged."""
    folders = registered_model_names()
    if name not in folders:
        return name
    folder = folders[name]
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise FileNotFoundError(
            f"The {name} model is missing from {folder}. {_if_missing[name] or 'Save the model there again.'}"
        )
    return folder


def model_name(path: str) -> str:
    """The registered name of the folder ``path`` (wherever the package is installed); else ``path``."""
    for name, folder in registered_model_names().items():
        if os.path.isdir(path) and os.path.isdir(folder) and os.path.samefile(path, folder):
            return name
    return path


def _import_registrants() -> None:
    global _registrants_imported
    if not _registrants_imported:
        _registrants_imported = True
        for module in REGISTRANTS:
            importlib.import_module(module)
