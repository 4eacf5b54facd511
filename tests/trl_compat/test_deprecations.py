"""No deprecation warning of our making, on whichever releases are installed (CI: the newest our ranges allow, and the
lowest pins): the toy preset's config through a recipe's parser, its trainer, and a training step.

A DeprecationWarning or FutureWarning is ours when our code made the deprecated call, or when upstream code made it on
an object of ours (a method of `GRPOConfig` or `GRPOTrainer` running on our subclass, reading the values we give it):
walking out from the `warnings.warn` call to the first frame outside the library that warned, some frame is in our
package or runs on an instance of one of our classes. One that a library raises for another library's call on that
library's own objects is theirs and only reported: with transformers 5.25, PEFT's `get_peft_model` (called by TRL)
reads transformers' deprecated `is_gradient_checkpointing` on the PEFT model.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from pathlib import Path

from presets import recipe_trainer_kwargs

from trl_multiagent import MultiAgentGRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
OURS = ("trl_multiagent", "recipes")


def owner(filename: str) -> str | None:
    """The package a frame's file belongs to: a site-packages top-level name, ours, or None (the standard library
    and generated code, which pass a call on)."""
    path = Path(filename)
    if "site-packages" in path.parts:
        return path.parts[path.parts.index("site-packages") + 1].removesuffix(".py")
    if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in (*OURS, "tests"):
        return path.relative_to(ROOT).parts[0]
    return None


def on_ours(frame) -> bool:
    """Whether ``frame`` runs a method on an object of one of our classes."""
    obj = frame.f_locals.get("self")
    return obj is not None and any(cls.__module__.split(".")[0] in OURS for cls in type(obj).__mro__)


def blame(frame) -> tuple[str, str]:
    """(the library that warned, who made it warn: ours, or the library that called it), from the frame of
    `warnings.warn`'s caller outward."""
    frames = []
    while frame is not None:
        if owner(frame.f_code.co_filename) is not None:
            frames.append(frame)
        frame = frame.f_back
    warned = owner(frames[0].f_code.co_filename)
    for frame in frames:
        if owner(frame.f_code.co_filename) in OURS or on_ours(frame):
            return warned, "ours"
        if owner(frame.f_code.co_filename) != warned:
            return warned, owner(frame.f_code.co_filename)
    return warned, warned


def deprecations(run) -> list[tuple[str, str, str]]:
    """(library that warned, who made it warn, message) of every DeprecationWarning or FutureWarning ``run``
    raises."""
    found = []

    def record(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DeprecationWarning | FutureWarning):
            found.append((*blame(inspect.currentframe().f_back), str(message)))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        run()
    return found


def test_the_toy_config_trainer_and_a_step_raise_no_deprecation_of_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "warnoptions", [])
    settings = (
        *("--config", "recipes/configs/toy.yaml", "--output_dir", str(tmp_path), "--max_steps", "1"),
        *("--per_device_train_batch_size", "8", "--max_completion_length", "12", "--save_strategy", "no"),
    )
    built = {}

    def build():
        built["kwargs"] = recipe_trainer_kwargs("eval_opt_math", *settings, "--dataset_name", "arithmetic")
        built["trainer"] = MultiAgentGRPOTrainer(**built["kwargs"])

    found = deprecations(build) + deprecations(lambda: built["trainer"].train())
    ours = [item for item in found if item[1] == "ours"]
    assert ours == [], f"deprecated calls of ours: {ours}\n(and of other libraries: {set(found) - set(ours)})"
    assert built["trainer"].state.global_step == 1
