"""What to do about each drift alarm: the setting the toy records found to help, and the section of
docs/monitoring.md that says more.

One entry per alarm kind; a new kind joins the table with its own entry (tests/monitoring/test_alarm_advice.py fails
for a kind without one). The alarm's warning, its row in `trl-multiagent report` and the stop under `stop_on_drift`
read it; the stop's resume command carries the entry's command-line flags.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

DOCS = "docs/monitoring.md"
ROLE = "{role}"  # stands for the alarm's role in `flags`


@dataclass(frozen=True)
class AlarmAdvice:
    """What to do about one kind of alarm."""

    setting: str  # the setting as written in Python, e.g. `role_rewards="balanced"`; "" where no record found one
    flags: tuple[str, ...]  # the same setting on the command line, ROLE standing for the alarm's role
    why: str  # what the records found it does, or, without a setting, what to look at
    section: str  # the anchor of the section of docs/monitoring.md

    def flags_for(self, role: str) -> list[str]:
        return [flag.replace(ROLE, role) for flag in self.flags]

    def sentence(self, role: str) -> str:
        """One sentence for the alarm's warning and report row."""
        link = f"{DOCS}#{self.section}"
        if not self.setting:
            return f"What to do: {self.why} ({link})."
        return f"What to do: set `{self.setting.replace(ROLE, role)}`: {self.why} ({link})."


_CAPTURE = AlarmAdvice(
    setting='role_loss_weights={"{role}": 8.0}',
    flags=("--role_loss_weights", '{"{role}": 8.0}'),
    why="an equal share of the shared adapter for the judge; in record M4 shared Eval-Opt's evaluator weighted 8x "
    "took about half the adapter's gradient instead of 4% and kept judging, with success as before. Raise the "
    "weight until the judge's `grad_norm_share` nears its share of calls, or give it its own adapter in a new run "
    '(`policy_sharing="isolated"`)',
    section="a-judge-captured",
)
_AMPLIFICATION = AlarmAdvice(
    setting='update_schedule="merged"',
    flags=("--update_schedule", "merged"),
    why="one update per generation batch instead of one per mini-batch, where the role has several instances "
    "(voters, workers) under `mini_batches`; in record M1 it moved 8 voters' policy 27x less per step, the update "
    "growth that preceded record M3's decline (whether it delays the decline is not measured yet)",
    section="a-role-amplified",
)

ADVICE: dict[str, AlarmAdvice] = {
    "judge_base_rate": AlarmAdvice(
        setting='role_rewards="balanced"',
        flags=("--role_rewards", "balanced"),
        why="the balanced judge reward: each verdict weighed so that the batch's reward is the judge's balanced "
        "accuracy, and always giving the common verdict earns 0.5 whatever the base rate. Under shared policy, "
        "an equal share of the adapter held the judge's balanced accuracy too (record M4)",
        section="a-judge-at-the-base-rate",
    ),
    "judge_code": _CAPTURE,
    "judge_length": _CAPTURE,
    "entropy_rise": _AMPLIFICATION,
    "perplexity_rise": _AMPLIFICATION,
    "length_drift": AlarmAdvice(
        setting="",
        flags=(),
        why="no record has measured a setting against it yet: read the role's completions (`log_completions=True`); "
        "a KL anchor for the role (`role_beta`) or a lower learning rate holds its length",
        section="a-roles-length-drifting",
    ),
    "length_cap": AlarmAdvice(
        setting="",
        flags=(),
        why="no record has measured a setting against it yet: if the role's outputs are long by right, raise "
        "`max_completion_length` or the role's `max_tokens` (`role_generation_kwargs`); else treat it as length drift",
        section="a-roles-length-drifting",
    ),
    "adapter_mismatch": AlarmAdvice(
        setting="",
        flags=(),
        why="a serving fault, not learning: the trainer's warning names the adapter and versions that served the "
        "role; `fail_on_adapter_mismatch=True` stops the run at the first",
        section="an-adapter-mismatch",
    ),
}


def alarm_advice(kind: str, role: str) -> str:
    """The "What to do" sentence of an alarm of ``kind`` on ``role`` ("" for a kind without an entry)."""
    advice = ADVICE.get(kind)
    return "" if advice is None else advice.sentence(role)


def advised_flags(alarms: Iterable[tuple[str, str]]) -> list[str]:
    """The command-line flags that apply the advice for ``alarms`` ((role, kind) pairs), each option once: the JSON
    objects of an option named by several alarms (one weight per judge) merged, other repeats kept at the first."""
    values: dict[str, str] = {}
    for role, kind in alarms:
        advice = ADVICE.get(kind)
        flags = advice.flags_for(role) if advice is not None else []
        for option, value in zip(flags[::2], flags[1::2]):
            if option in values and values[option].startswith("{") and value.startswith("{"):
                value = json.dumps({**json.loads(values[option]), **json.loads(value)})
            elif option in values:
                continue
            values[option] = value
    return [part for option, value in values.items() for part in (option, value)]
