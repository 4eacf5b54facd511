"""Per-role rewards: a reward for every call of a role, from what that role's output means.

The outcome reward says whether the episode's final answer is right; a judge that praises wrong attempts can still
share in a right outcome. Two built-in variants (``role_rewards``) read the roles' declared output formats
(``Workflow.formats``); "right" is the outcome reward (the trainer's ``reward_funcs``) scored on that call's own text:
at least 1.

- ``"reference"``, the reference stack's per-role variant (its ``use_final_outcome_reward=False``), each role graded
  as the workflow's ``role_reward_policy`` says (``workflows/reward_policy.py``): by its own output, an answer
  (generator, voter, synthesizer) rewarded when it is right, a verdict (evaluator) when it matches whether the
  attempt it judged is right (an unreadable verdict 0), a selection (aggregator) when the answer it selected is
  right; by the episode's outcome (an answer or a selection gets it, a verdict is compared with it: the reference's
  code workflows); or 0 (Orch-Workers' orchestrator and workers: no gradient). The built-in workflows declare the
  reference's policies.
- ``"own_answers"``, this library's variant: every role by its own output, whatever the policy (workers by their own
  answers, a plan by the episode's outcome), and an unreadable verdict reads as Incorrect (as Eval-Opt reads it to
  go on).
- ``"balanced"``: ``"reference"`` with each judge's verdicts class-balanced, so that a judge cannot earn its reward
  by repeating the base rate. Over a verdict role's graded calls in the batch (this process's episodes), n of them,
  n_c judging an attempt whose truth is c (right or wrong), C the number of truths present: a right verdict on an
  attempt of truth c gets n / (C * n_c), a wrong or unreadable one 0. The batch mean of the reward is then the
  judge's balanced accuracy (the mean of its accuracy on right attempts and on wrong ones): a judge answering
  "Correct" always earns 0.5, however rare wrong attempts are, where ``"reference"`` would give it the share of
  right attempts. With one truth present in the batch it is ``"reference"``'s reward.

A plan role that the policy does not zero gets the episode's outcome in all three.

Users pass their own as ``role_reward_funcs={"evaluator": fn}``: TRL's reward signature, called once per role with
that role's calls of the batch: ``fn(prompts, completions, completion_ids, judged, candidates, final_answer,
**columns) -> list[float | None]``; ``judged`` is the text of the answer a verdict judged (else None),
``candidates`` the answers a selection chose among, ``final_answer`` the episode's, and ``columns`` the dataset row's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..workflows.correctness import grade_calls, solved
from ..workflows.formats import references
from ..workflows.reward_policy import OUTCOME, ZERO, RoleRewardPolicy

Scorer = Callable[[list[str], list[dict]], list[float]]  # (texts, their rows) -> outcome reward of each text
ROLE_REWARD_VARIANTS = ("reference", "own_answers", "balanced")


class RequestedRoleRewards:
    """The per-role rewards a run asks for: the user's ``role_reward_funcs`` if any, else the built-in ``variant``
    (``role_rewards``; each answering role's text graded by ``reward_funcs`` at ``reward_weights``, as the outcome
    reward grades a final answer), else none."""

    def __init__(
        self, workflow, *, variant: str | None, reward_funcs: Sequence[Callable], reward_weights: Sequence[float]
    ):
        self.workflow, self.variant = workflow, variant
        self.score = None if variant is None else outcome_scorer(reward_funcs, reward_weights)

    def __call__(
        self,
        episodes: Sequence,
        rows: Sequence[dict],
        outcome: Sequence[float],
        *,
        funcs: Mapping[str, Callable] | None,
    ) -> list[list[float | None]] | None:
        """The reward of every call of every episode (``outcome``: each episode's outcome reward; ``funcs``: the
        user's functions by role, read at every step); None when the run asks for none."""
        if funcs:
            return custom_role_rewards(funcs, self.workflow.formats, episodes, rows)
        if self.variant is not None:
            return builtin_role_rewards(self.variant, self.workflow, episodes, rows, outcome, self.score)
        return None


def builtin_role_rewards(
    variant: str, workflow, episodes: Sequence, rows: Sequence[dict], outcome: Sequence[float], score: Scorer
) -> list[list[float | None]]:
    """The ``variant`` per-role reward (see the module docstring) of every call of every episode of ``workflow``
    (None for a role without a format); ``outcome``: each episode's outcome reward."""
    if variant not in ROLE_REWARD_VARIANTS:
        raise ValueError(f"`role_rewards` must be one of {ROLE_REWARD_VARIANTS}, got {variant!r}.")
    formats, reference = workflow.formats, variant in ("reference", "balanced")
    policy = workflow.role_reward_policy if reference else RoleRewardPolicy()
    answers = [
        (e, i) for e, ep in enumerate(episodes) for i, c in enumerate(ep.calls) if _kind(formats, c) == "answer"
    ]
    scores = score([episodes[e].calls[i].text for e, i in answers], [rows[e] for e, _ in answers]) if answers else []
    right: list[dict[int, bool]] = [{} for _ in episodes]  # episode -> answer call -> is it right
    for (e, i), value in zip(answers, scores):
        right[e][i] = solved(value)
    rewards = []
    verdicts: list[tuple[int, int, str, bool]] = []  # (episode, call, role, truth of what it judged)
    for e, episode in enumerate(episodes):
        per_call: list[float | None] = []
        # reference: an unreadable verdict is wrong (rewarded 0); own_answers: it reads as Incorrect
        grades = grade_calls(formats, episode.calls, right[e], strict_verdicts=reference)
        judged = [ref.judged for ref in references(formats, episode.calls)]
        for i, (call, grade) in enumerate(zip(episode.calls, grades)):
            kind, fmt, source = _kind(formats, call), formats.get(call.role), policy.source(call.role)
            if source == ZERO:
                per_call.append(0.0)
            elif source == OUTCOME and kind in ("answer", "selection"):
                per_call.append(float(solved(outcome[e])))
            elif source == OUTCOME and kind == "verdict":
                verdict = fmt.parse(call.text)  # None when unreadable: rewarded 0
                per_call.append(float(verdict == solved(outcome[e])))
                verdicts.append((e, i, call.role, solved(outcome[e])))
            elif kind == "plan":
                per_call.append(float(outcome[e]))
            else:  # answers, verdicts and selections by their own grade; None where there is nothing to grade
                per_call.append(None if grade.right is None else float(grade.right))
                if kind == "verdict" and grade.right is not None:
                    verdicts.append((e, i, call.role, right[e][judged[i]]))
        rewards.append(per_call)
    if variant == "balanced":
        for role in dict.fromkeys(role for _, _, role, _ in verdicts):
            calls = [(e, i, truth) for e, i, r, truth in verdicts if r == role]
            weights = balanced_weights([truth for _, _, truth in calls])
            for (e, i, _), weight in zip(calls, weights):
                rewards[e][i] *= weight
    return rewards


def balanced_weights(truths: Sequence[bool]) -> list[float]:
    """The weight of each verdict of a group: n / (C * n_c) for a verdict judging an attempt of truth c (n verdicts,
    n_c of truth c, C truths present); a right verdict's reward 1 times it averages to the balanced accuracy."""
    truths = list(truths)
    counts = {truth: truths.count(truth) for truth in set(truths)}
    return [len(truths) / (len(counts) * counts[truth]) for truth in truths]


def custom_role_rewards(
    funcs: Mapping[str, Callable], formats: Mapping[str, Any], episodes: Sequence, rows: Sequence[dict]
) -> list[list[float | None]]:
    """``funcs[role]`` on each role's calls (see the module docstring); None for roles without a function."""
    rewards: list[list[float | None]] = [[None] * len(e.calls) for e in episodes]
    for role, func in funcs.items():
        where, kwargs = [], {"prompts": [], "completions": [], "completion_ids": [], "judged": [], "candidates": []}
        kwargs["final_answer"] = []
        columns: dict[str, list] = {key: [] for key in (rows[0] if rows else {}) if key != "prompt"}
        for e, episode in enumerate(episodes):
            contexts = references(formats, episode.calls)
            for i, call in enumerate(episode.calls):
                if call.role != role:
                    continue
                where.append((e, i))
                context = contexts[i]
                kwargs["prompts"].append(call.messages)
                kwargs["completions"].append(call.text)
                kwargs["completion_ids"].append(call.completion_ids)
                kwargs["judged"].append(None if context.judged is None else episode.calls[context.judged].text)
                kwargs["candidates"].append([episode.calls[k].text for k in context.candidates])
                kwargs["final_answer"].append(episode.final_answer)
                for key in columns:
                    columns[key].append(rows[e][key])
        if not where:
            continue
        values = func(**kwargs, **columns)
        if len(values) != len(where):
            raise ValueError(f"role_reward_funcs[{role!r}] returned {len(values)} rewards for {len(where)} calls.")
        for (e, i), value in zip(where, values):
            rewards[e][i] = None if value is None else float(value)
    return rewards


def _kind(formats: Mapping[str, Any], call) -> str | None:
    return getattr(formats.get(call.role), "kind", None)


def outcome_scorer(reward_funcs: Sequence[Callable], weights: Sequence[float]) -> Scorer:
    """Scores texts as if each were an episode's final answer: the weighted sum of the outcome reward functions
    (TRL's signature, called with the rows' columns), None counting as 0."""
    for func in reward_funcs:
        if not callable(func) or hasattr(func, "forward"):
            raise ValueError(
                "`role_rewards` grades each role's own answer with `reward_funcs`, which must be functions "
                "(a reward model cannot grade role outputs here); pass `role_reward_funcs` instead."
            )

    def score(texts: list[str], rows: list[dict]) -> list[float]:
        conversational = isinstance(rows[0]["prompt"], list)  # as the episodes' final answers are passed
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)
        columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion")}
        totals = [0.0] * len(texts)
        for func, weight in zip(reward_funcs, weights):
            values = func(prompts=[row["prompt"] for row in rows], completions=completions, **columns)
            totals = [t + weight * (v or 0.0) for t, v in zip(totals, values)]
        return totals

    return score
