r"""What each role did in one generation batch: format, style, length, and (given ground truth) who was right.

Global reward curves hide the failures the paper reports: a judge that starts writing code or re-solving the
problem, an aggregator turning into a fourth voter, a synthesizer whose median output collapses while its p95 hits
the length cap. ``workflow_metrics`` reads them off the rollout records of one batch, in pure python (no torch, no
model), so the trainer can log them next to its own ``role/<role>/...`` metrics and ``RoleDriftCallback`` can
watch them.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..rollout.records import Episode
from ..workflows import OutputFormat, Workflow
from ..workflows.correctness import grade_calls
from ..workflows.formats import references
from .pass_at_k import pass_at_k

AnswerChecker = Callable[[str, Any], bool]  # (role output text, the row's ground truth) -> is it right?

# An opening fence line (```python, ```cpp, bare ```), closed or not: a judge cut off mid-program still wrote code.
_FENCE_OPEN = re.compile(r"```[^\n`]*\n")


def workflow_metrics(
    workflow: Workflow,
    episodes: Sequence[Episode],
    rewards: Sequence[float],
    answer_checker: AnswerChecker | None = None,
    answers: Sequence[Any] | None = None,
) -> dict[str, float]:
    r"""``workflow/...`` and ``role/<role>/...`` metrics of the episodes of one generation batch.

    ``rewards[i]`` is the outcome reward of ``episodes[i]`` (NaN for an unscorable episode, as the trainer leaves
    it). ``answer_checker(text, answer) -> bool`` grades one role output against the row's ground truth
    ``answers[i]`` (e.g. ``lambda text, answer: math_reward([text], [answer])[0] == 1.0``); pass both or neither.
    A metric whose population is empty in this batch is left out rather than logged as 0. Fractions are in [0, 1].

    Every workflow, for each role type with at least one call:

    - ``workflow/success``: mean outcome reward over the scorable episodes (for 0/1 rewards, the solve rate).
    - ``role/<role>/code_block_fraction``: share of the role's outputs with a fenced block (a line opening with
      three backticks, any language, closed or not). The paper's "evaluator writes code" signature.
    - ``role/<role>/words_median``, ``role/<role>/words_p95``: whitespace-separated words per output; median, and
      the nearest-rank 95th percentile (the ``ceil(0.95 n)``-th smallest, so the largest when ``n < 20``).

    The rest is read off what the workflow declares in ``workflow.formats`` (role -> output format, see
    ``workflows.formats``), so a user workflow that declares formats gets the same metrics as the built-ins:

    - every declared role: ``role/<role>/unparseable``, the share of its outputs the format's ``parse`` could not
      read (the workflow used its fallback).
    - ``"answer"`` roles, with ground truth: ``workflow/regraded/<role>``, the share of its outputs that are right.
      A parallel answer role (one with instances > 0 in the batch: voters, workers) also gives, over each episode's
      outputs of that role (any number of them): ``workflow/any_correct`` (share of episodes with at least one
      right) and ``workflow/pass@<k>`` for ``k = 1 ..`` the most instances seen (unbiased pass@k averaged over the
      episodes with at least ``k``; ``pass@n == any_correct`` when every episode has ``n``).
    - ``"verdict"`` roles judge the latest answer before them in the episode: ``workflow/verdict_correct_rate`` /
      ``..._incorrect_rate`` / ``..._unparseable_rate`` (shares of verdicts that are Correct / Incorrect / none; they
      sum to 1); ``workflow/iterations`` (mean calls per episode of the judged answer role) and
      ``workflow/retry_rate`` (share of episodes with more than one). With ground truth:
      ``workflow/verdict_accuracy``, the share of verdicts that are right (Correct iff the judged answer is right;
      no verdict counts as Incorrect, since Eval-Opt retries on it); per verdict role, ``role/<role>/verdict_accuracy``
      and, when the batch holds both right and wrong judged answers, ``role/<role>/verdict_balanced_accuracy``: the
      mean of its accuracy on right answers and on wrong ones (0.5 for a judge that always says the same, however
      rare the other kind is).
    - ``"selection"`` roles pick among the latest answer of each instance of the answer role before them:
      ``workflow/selection/<i>`` for ``i = 1 .. n_candidates``, the share of episodes whose pick (after the
      fallbacks, 1-based) was ``i``; with ground truth, ``workflow/selection_accuracy``: among episodes with a right
      candidate, the share whose pick is right.
    - ``"plan"`` roles: ``workflow/plan_size``, the mean number of strategies read per plan (Orch-Workers runs one
      worker per strategy).

    Parallel instances are ordered by ``ModelCall.instance`` (the records list calls in the order they came back).
    """
    if len(rewards) != len(episodes):
        raise ValueError(
            f"Got {len(rewards)} rewards for {len(episodes)} episodes; pass this process's episodes and the rewards "
            "of exactly those episodes (slice the gathered rewards to the process's rows)."
        )
    if (answer_checker is None) != (answers is None):
        raise ValueError("Pass both `answer_checker` and `answers` to grade role outputs, or neither.")
    if answers is not None and len(answers) != len(episodes):
        raise ValueError(f"Got {len(answers)} answers for {len(episodes)} episodes; pass one ground truth each.")

    metrics: dict[str, float] = {}
    scored = [float(r) for r in rewards if not math.isnan(r)]
    if scored:
        metrics["workflow/success"] = statistics.fmean(scored)
    metrics.update(_style_metrics(episodes))

    metrics.update(_declared_metrics(workflow.formats, episodes, answer_checker, answers))
    return metrics


def _style_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    texts: dict[str, list[str]] = defaultdict(list)
    for episode in episodes:
        for call in episode.calls:
            texts[call.role].append(call.text)
    metrics = {}
    for role, outputs in texts.items():
        words = sorted(len(text.split()) for text in outputs)
        metrics[f"role/{role}/code_block_fraction"] = _share(bool(_FENCE_OPEN.search(text)) for text in outputs)
        metrics[f"role/{role}/words_median"] = float(statistics.median(words))
        metrics[f"role/{role}/words_p95"] = float(words[math.ceil(0.95 * len(words)) - 1])
    return metrics


def _declared_metrics(
    formats: Mapping[str, OutputFormat],
    episodes: Sequence[Episode],
    answer_checker: AnswerChecker | None,
    answers: Sequence[Any] | None,
) -> dict[str, float]:
    kind = {role: fmt.kind for role, fmt in formats.items()}
    answer_calls = [
        (e, i) for e, ep in enumerate(episodes) for i, c in enumerate(ep.calls) if kind.get(c.role) == "answer"
    ]
    parallel = {episodes[e].calls[i].role for e, i in answer_calls if episodes[e].calls[i].instance > 0}
    graded = answer_checker is not None
    right_of: dict[int, dict[int, bool]] = defaultdict(dict)  # episode -> answer call -> is it right
    for e, i in answer_calls if graded else ():
        right_of[e][i] = bool(answer_checker(episodes[e].calls[i].text, answers[e]))
    group_role = next((role for role in formats if role in parallel), None)  # pass@k over the first parallel one
    unreadable: dict[str, list[bool]] = defaultdict(list)
    right: dict[str, list[bool]] = defaultdict(list)
    groups: list[list[bool]] = []
    iterations, verdicts, verdict_right, plan_sizes, selection_right = [], [], [], [], []
    judged_truth: dict[str, list[tuple[bool, bool]]] = defaultdict(
        list
    )  # verdict role -> (answer right, verdict right)
    # A selection format's candidate count, when it declares one, so that never-picked candidates log 0.
    selectors = [fmt for fmt in formats.values() if fmt.kind == "selection"]
    picks = [0] * max((getattr(fmt, "n_candidates", 0) for fmt in selectors), default=0)
    for e, episode in enumerate(episodes):
        judged_roles = set()
        grades = grade_calls(formats, episode.calls, right_of[e]) if graded else None
        for i, (call, ref) in enumerate(zip(episode.calls, references(formats, episode.calls))):
            fmt = formats.get(call.role)
            if fmt is None:
                continue
            unreadable[call.role].append(fmt.parse(call.text) is None)
            if fmt.kind == "answer":
                if graded:
                    right[call.role].append(grades[i].right)
            elif fmt.kind == "verdict":
                verdicts.append(fmt.parse(call.text))
                if ref.judged is not None:
                    judged_roles.add(episode.calls[ref.judged].role)
                    if graded:
                        verdict_right.append(grades[i].right)
                        judged_truth[call.role].append((right_of[e][ref.judged], grades[i].right))
            elif fmt.kind == "selection":
                if ref.candidates:
                    index = min(fmt.read(call.text), len(ref.candidates) - 1)
                    picks += [0] * (index + 1 - len(picks))
                    picks[index] += 1
                    if graded and any(grades[i].candidates):
                        selection_right.append(grades[i].right)
            elif fmt.kind == "plan":
                plan_sizes.append(len(fmt.read(call.text)))
        for role in judged_roles:
            iterations.append(sum(call.role == role for call in episode.calls))
        if graded and group_role is not None:
            group = [right_of[e][i] for i in _indices(episode, group_role)]
            if group:
                groups.append(group)

    metrics = {f"role/{role}/unparseable": _share(flags) for role, flags in unreadable.items() if flags}
    metrics |= {f"workflow/regraded/{role}": _share(flags) for role, flags in right.items() if flags}
    if groups:
        metrics["workflow/any_correct"] = _share(any(group) for group in groups)
        for k in range(1, max(len(group) for group in groups) + 1):
            # An episode with fewer than k instances (fewer strategies, a crashed call) cannot give pass@k.
            values = [pass_at_k(len(g), sum(g), k) for g in groups if len(g) >= k]
            metrics[f"workflow/pass@{k}"] = statistics.fmean(values)
    if iterations:
        metrics["workflow/iterations"] = statistics.fmean(iterations)
        metrics["workflow/retry_rate"] = _share(n > 1 for n in iterations)
    if verdicts:
        metrics["workflow/verdict_correct_rate"] = _share(v is True for v in verdicts)
        metrics["workflow/verdict_incorrect_rate"] = _share(v is False for v in verdicts)
        metrics["workflow/verdict_unparseable_rate"] = _share(v is None for v in verdicts)
    if verdict_right:
        metrics["workflow/verdict_accuracy"] = _share(verdict_right)
    for role, pairs in judged_truth.items():
        metrics[f"role/{role}/verdict_accuracy"] = _share(ok for _, ok in pairs)
        per_truth = [[ok for truth, ok in pairs if truth is kind] for kind in (True, False)]
        if all(per_truth):
            metrics[f"role/{role}/verdict_balanced_accuracy"] = statistics.fmean(map(_share, per_truth))
    if sum(picks):
        metrics |= {f"workflow/selection/{k + 1}": count / sum(picks) for k, count in enumerate(picks)}
    if selection_right:
        metrics["workflow/selection_accuracy"] = _share(selection_right)
    if plan_sizes:
        metrics["workflow/plan_size"] = statistics.fmean(plan_sizes)
    return metrics


def _indices(episode: Episode, role: str) -> list[int]:
    """The episode's calls of one role type: parallel instances by instance, sequential calls in call order."""
    calls = episode.calls
    return sorted((i for i, call in enumerate(calls) if call.role == role), key=lambda i: calls[i].instance)


def _share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(flags) / len(flags)
