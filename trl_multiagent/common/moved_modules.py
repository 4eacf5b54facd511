"""Modules that moved keep working under their old import paths for one release, with a warning.

``MOVED_MODULES`` maps each old path to the new one; ``MovedModules``, an import finder the package's ``__init__`` puts
first on ``sys.meta_path`` (``serve_moved_modules``), answers for the old paths only: importing one warns, naming the
new path and the release that removes the old, and gives the module at the new path (the same module object). Nothing
here imports torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

from .deprecation import warn_deprecated

# Modules that moved when the package's root modules went into folders: old path -> new path. `trainer`,
# `config` and `cli` became packages of the same name, which keep their public names.
MOVED_MODULES = {
    "trl_multiagent.trainer_parts": "trl_multiagent.trainer.parts",
    "trl_multiagent.grpo_seam": "trl_multiagent.trainer.grpo_seam",
    "trl_multiagent.renamed_hooks": "trl_multiagent.trainer.renamed_hooks",
    "trl_multiagent.grpo_config_fields": "trl_multiagent.config.grpo_config_fields",
    "trl_multiagent.run_checks": "trl_multiagent.config.run_checks",
    "trl_multiagent.recipe_parser": "trl_multiagent.cli.recipe_parser",
    "trl_multiagent.shipped": "trl_multiagent.cli.shipped",
    "trl_multiagent.validation": "trl_multiagent.cli.validation",
    "trl_multiagent.slurm": "trl_multiagent.cli.slurm",
    "trl_multiagent.vllm_serve": "trl_multiagent.cli.vllm_serve",
    "trl_multiagent.serve_process": "trl_multiagent.cli.serve_process",
    "trl_multiagent.report": "trl_multiagent.cli.report",
    "trl_multiagent.deprecation": "trl_multiagent.common.deprecation",
    "trl_multiagent.model_names": "trl_multiagent.common.model_names",
    "trl_multiagent.parse_rules": "trl_multiagent.common.parse_rules",
    # Renamed so that the adapters' modules are not all called "... steps".
    "trl_multiagent.adapters.adapter_steps": "trl_multiagent.adapters.clip_and_step",
    "trl_multiagent.adapters.optimizer_steps": "trl_multiagent.adapters.optimizer",
    "trl_multiagent.adapters.engine_steps": "trl_multiagent.adapters.deepspeed_groups",
    "trl_multiagent.adapters.lr_steps": "trl_multiagent.adapters.per_update_lr",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import finder for ``MOVED_MODULES``: importing an old path warns once and gives the module at its new path
    (the same module object, so its state is shared)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        # The import system's own frames are skipped when the warning is placed: it points at the import line.
        warn_deprecated(f"module {spec.name}", f"`{MOVED_MODULES[spec.name]}`", stacklevel=3)
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module) -> None:
        # The module at the new path ran already; the import system set its `__spec__` to the old path's: put back
        # its own, so that it still reads as the module it is (reloading, `importlib.util.find_spec`).
        module.__spec__ = importlib.machinery.PathFinder.find_spec(module.__name__, _package_path(module.__name__))


def _package_path(name: str) -> list[str]:
    return list(sys.modules[name.rpartition(".")[0]].__path__)


def serve_moved_modules() -> None:
    """Put ``MovedModules`` on the import path, once (the package's ``__init__`` does it)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())  # before any finder that could find a stale copy at the old path
