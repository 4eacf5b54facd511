"""A run that cannot learn, said early: most GRPO groups carry no signal while a role's outputs fail its format.

GRPO learns from the spread of rewards among the episodes of one prompt; a prompt whose episodes all score alike
gives every call advantage 0. When that holds for most prompts of the first training batches and some role's
outputs mostly fail the format the workflow declares for it, the likely cause is a model asked in words it was not
trained on or read by a rule it does not follow (the shipped toy model under the paper's prompts and readers): the
run would log flat success and zero gradients without saying why. ``LearningSignalCheck`` looks at the first
``window`` training generation batches and, if both hold, warns once, naming each such role, its unparseable share,
the format it was asked for and the likely fix.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ..workflows.formats import OutputFormat

logger = logging.getLogger(__name__)

# The workflow options the toy presets set (recipes/configs/toy.yaml), the requests and readers the shipped toy model
# was trained on; tests/monitoring/test_learning_signal.py keeps them equal to the preset's.
TOY_WORKFLOW_OPTIONS = {
    "prompts": "guarded",
    "parsing": "robust",
    "history": "fresh",
    "workers": "fixed",
    "template": "raw",
}


class LearningSignalCheck:
    """Feed it each training generation batch (``observe``); at the end of the first ``window`` it decides once.

    It warns when, over those batches, more than ``flat_share`` of the prompts' groups had every scorable episode
    scored alike (or fewer than two scorable), and some role with a declared format had at least
    ``unparseable_share`` of its outputs unreadable by that format (the mean of its ``role/<role>/unparseable``
    over the batches). The warning is a ``logger.warning`` (main process) and ``alarm/<role>/no_signal = 1.0`` in
    that batch's metrics, one per role named.

    Args:
        formats: the workflow's declared role formats.
        workflow_config: the workflow's ``config_dict()``: its options, named in the fix.
        main_process: whether this process writes the warning.
    """

    def __init__(
        self,
        formats: Mapping[str, OutputFormat],
        workflow_config: Mapping[str, Any],
        *,
        main_process: bool = True,
        window: int = 3,
        flat_share: float = 0.5,
        unparseable_share: float = 0.4,
    ) -> None:
        self.formats = dict(formats)
        self.workflow_config = dict(workflow_config)
        self.main_process = main_process
        self.window, self.flat_share, self.unparseable_share = window, flat_share, unparseable_share
        self.batches = 0
        self.flat: list[bool] = []  # per prompt group of the window: did its episodes all score alike
        self.unparseable: dict[str, list[float]] = defaultdict(list)  # role -> its unparseable share per batch
        self.warned: dict[str, float] = {}  # role -> its unparseable share, when the check warned

    def observe(self, groups: Sequence[Sequence[float]], metrics: Mapping[str, float]) -> dict[str, float]:
        """One training generation batch: ``groups`` the outcome rewards of each prompt's episodes (NaN:
        unscorable), ``metrics`` the batch's workflow metrics (``role/<role>/unparseable``). Returns the alarm
        metrics to log (empty but at the window's end, when it warns)."""
        if self.batches >= self.window:
            return {}
        self.batches += 1
        for rewards in groups:
            scored = [r for r in rewards if not math.isnan(r)]
            self.flat.append(len(set(scored)) < 2)
        for role in self.formats:
            if (value := metrics.get(f"role/{role}/unparseable")) is not None:
                self.unparseable[role].append(value)
        if self.batches < self.window or not self.flat or statistics.fmean(self.flat) <= self.flat_share:
            return {}
        shares = {role: statistics.fmean(values) for role, values in self.unparseable.items()}
        self.warned = {role: share for role, share in shares.items() if share >= self.unparseable_share}
        if self.warned and self.main_process:
            logger.warning(self.message())
        return {f"alarm/{role}/no_signal": 1.0 for role in self.warned}

    def message(self) -> str:
        flat = statistics.fmean(self.flat)
        roles = "; ".join(
            f"role {role!r} failed its declared format {self.formats[role]!r} in {share:.0%} of its outputs"
            for role, share in self.warned.items()
        )
        options = {key: value for key, value in self.workflow_config.items() if key in TOY_WORKFLOW_OPTIONS}
        toy = {key: TOY_WORKFLOW_OPTIONS[key] for key, value in options.items() if value != TOY_WORKFLOW_OPTIONS[key]}
        name = self.workflow_config.get("workflow", "the workflow")
        fix = (
            "Likely fix: ask for and read the format the model was trained to write: the workflow's prompts and "
            "readers" + (f" (this run: {_keywords(options)})" if options else "") + ". The shipped toy model was "
            "trained on the toy presets' workflow options (recipes/configs/toy.yaml: "
            + ", ".join(f"{key}: {value}" for key, value in TOY_WORKFLOW_OPTIONS.items())
            + ")"
            + (f": build {name}({_keywords(toy)}) or train with --config toy." if toy else ".")
        )
        return (
            f"This run can hardly learn: in its first {self.batches} generation batches, {flat:.0%} of the prompts' "
            f"GRPO groups had every episode scored alike (advantage 0, no gradient), and {roles}. {fix}"
        )


def _keywords(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in options.items())
