"""Deprecated names: a public name that moved or was renamed keeps working for one release, with a warning.

``warn_deprecated`` says what to use instead and in which release the old name goes; ``moved_names`` builds a module
``__getattr__`` that serves a module's old names (``MOVED``) from where they live now; ``MovedModules`` serves a whole
module from its new path when imported by its old one (``MOVED_MODULES``). Nothing here imports torch (the workflows
package uses it and imports without torch).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable
from typing import Any

# The release that removes what is deprecated now (the package is at 0.1.0; the next release deprecates).
REMOVED_IN = "0.3.0"

_RULES = "trl_multiagent.common.parse_rules"
_SERVER_ERRORS = "trl_multiagent.rollout.backends.server_errors"
# Every public module-level name that moved: module -> {old name: where it is now, or (what to use instead, what
# serves the old name until it goes) when the replacement is called differently}. The trainer's renamed methods and
# attributes are in renamed_hooks.py.
MOVED = {
    # The model-name registry took these over from the toy world (0.1.0's recipes imported them from there).
    "trl_multiagent.toy": {
        "resolve_model_name": "trl_multiagent.common.model_names.resolve_model_name",
        "model_name": "trl_multiagent.common.model_names.model_name",
    },
    # The answer readers moved to one module that workflows and tasks share.
    "trl_multiagent.workflows": {
        "parse_selection": f"{_RULES}.parse_selection",
        "parse_strategies": f"{_RULES}.parse_strategies",
        "parse_verdict": f"{_RULES}.parse_verdict",
        "read_strategies": f"{_RULES}.read_strategies",
    },
    # Exception names end in `Error` (PEP 8).
    "trl_multiagent.rollout.engine": {"PromptTooLong": "trl_multiagent.rollout.engine.PromptTooLongError"},
    _SERVER_ERRORS: {"ServerLost": f"{_SERVER_ERRORS}.ServerLostError"},
    "trl_multiagent.rollout.backends.vllm_server": {"ServerLost": f"{_SERVER_ERRORS}.ServerLostError"},
    # Running a loaded workflow moved to evaluation when checkpoints became loading and saving only.
    "trl_multiagent.checkpoints": {
        "eos_token_ids": "trl_multiagent.evaluation.eos_token_ids",
        "make_generation_config": "trl_multiagent.evaluation.make_generation_config",
        "run_episodes": "trl_multiagent.evaluation.run_episodes",
    },
    # One task registry replaced evaluation's own table of datasets and rewards: (what to use, what serves the old
    # name meanwhile).
    "trl_multiagent.evaluation": {
        "eval_dataset": (
            "trl_multiagent.tasks.get_task(task).eval_dataset(dataset_name, limit)",
            "trl_multiagent.evaluation.task_shims.eval_dataset",
        ),
        "task_reward": (
            "trl_multiagent.tasks.get_task(task).make_reward()",
            "trl_multiagent.evaluation.task_shims.task_reward",
        ),
    },
}

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


def warn_deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """A ``DeprecationWarning`` naming ``old``, what replaces it (``new``) and the release that removes it."""
    warnings.warn(
        f"`{old}` is deprecated; use {new} instead. It will be removed in trl-multiagent {REMOVED_IN}.",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_names(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each of its old names in ``MOVED`` is fetched from its new place, with
    a warning; any other name is missing as usual."""
    moved = MOVED[module]

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        replacement, target = moved[name] if isinstance(moved[name], tuple) else (moved[name], moved[name])
        # `from package import name` asks `hasattr` first, from the import system's frames, then reads the name from
        # the importing module's: that read warns, pointing at the import line (where the default filters show it).
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("importlib"):
            warn_deprecated(f"{module}.{name}", f"`{replacement}`")
        where, _, attribute = target.rpartition(".")
        return getattr(importlib.import_module(where), attribute)

    return __getattr__


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
