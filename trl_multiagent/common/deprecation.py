"""Deprecated names: a public name that moved or was renamed keeps working for one release, with a warning.

``warn_deprecated`` says what to use instead and in which release the old name goes; ``moved_names`` builds a module
``__getattr__`` that serves a module's old names (``MOVED``) from where they live now (whole modules that moved:
moved_modules.py). Nothing here imports torch (the workflows package uses it and imports without torch).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any

# The release that removes what is deprecated now: the minor after the newest release (CHANGELOG.md's newest numbered
# section, `__version__`). A name deprecated in 0.2.0 works through 0.2.x and goes in 0.3.0; the release that removes
# them sets this to the minor after it (tests/package/test_releases.py keeps the three in step).
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
