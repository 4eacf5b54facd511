"""What the built-in per-role rewards give each role's calls: a grade of the call's own output, the episode's
outcome, or nothing.

A workflow declares one ``RoleRewardPolicy`` (``Workflow.role_reward_policy``); the per-role rewards
``role_rewards="reference"`` and ``"balanced"`` (training/role_rewards.py) read it, ``"own_answers"`` grades every
role by its own output whatever the policy says. Per role, the policy names a source:

- ``"own"`` (every role the policy does not name): the call's own output, read through the role's declared format: an
  answer is rewarded when it is right, a verdict when it matches whether the answer it judged is right, a selection
  when the answer it picked is right; a plan, which has no grade of its own, gets the episode's outcome reward.
- ``"outcome"``: the episode's outcome instead: an answer or a selection gets 1 when the final answer is right, a
  verdict when it matches whether the final answer is right (an unreadable verdict 0), a plan the outcome reward.
- ``"zero"``: 0 for every call (the role's calls still count in their GRPO groups, with no signal of their own).

For example a workflow whose final answer is the only one a grader can check (a program tested once, at the end)
rewards every role by the outcome: ``RoleRewardPolicy({role: "outcome" for role in roles})``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

OWN, OUTCOME, ZERO = "own", "outcome", "zero"
SOURCES = (OWN, OUTCOME, ZERO)


@dataclass(frozen=True)
class RoleRewardPolicy:
    """Role type -> the source of its calls' per-role reward (``"own"``, ``"outcome"`` or ``"zero"``, see the module
    docstring); roles it does not name are graded by their own output."""

    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wrong = {role: source for role, source in self.sources.items() if source not in SOURCES}
        if wrong:
            raise ValueError(f"RoleRewardPolicy sources must be one of {SOURCES}; got {wrong}.")

    def source(self, role: str) -> str:
        return self.sources.get(role, OWN)
