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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..rollout.records import Episode, ModelCall
from ..workflows import EvalOpt, OrchWorkers, SingleAgent, Voting, Workflow
from ..workflows.parsing import last_boxed, last_code_block, parse_selection, parse_strategies, parse_verdict

AnswerChecker = Callable[[str, Any], bool]  # (role output text, the row's ground truth) -> is it right?
Grader = Callable[[int, ModelCall], bool] | None  # (episode position, call) -> is the call's answer right?

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

    Every workflow (user workflows too), for each role type with at least one call:

    - ``workflow/success``: mean outcome reward over the scorable episodes (for 0/1 rewards, the solve rate).
    - ``role/<role>/code_block_fraction``: share of the role's outputs with a fenced block (a line opening with
      three backticks, any language, closed or not). The paper's "evaluator writes code" signature.
    - ``role/<role>/words_median``, ``role/<role>/words_p95``: whitespace-separated words per output; median, and
      the nearest-rank 95th percentile (the ``ceil(0.95 n)``-th smallest, so the largest when ``n < 20``).

    Answering roles (generator, worker, synthesizer) need an answer in the task's format: a ``\boxed{}`` for
    ``task="math"``, a closed ```` ```python ```` block for ``task="code"`` (``last_boxed`` / ``last_code_block``);
    ``SingleAgent`` has no task, so either format counts. ``role/<role>/unparseable`` is the share of the role's
    outputs the workflow could not read:

    - ``SingleAgent``: ``role/generator/unparseable``; with ground truth ``workflow/regraded/generator``, the share
      of generator outputs that are right.
    - ``Voting``: ``role/generator/unparseable``; ``role/aggregator/unparseable`` (no ``\boxed{i}`` with
      ``1 <= i <= n``, so ``parse_selection`` fell back); ``workflow/selection/<i>`` for ``i = 1 .. n_voters``:
      share of episodes whose aggregator picked voter ``i`` (1-based as the aggregator writes it, after
      ``parse_selection``'s fallbacks, i.e. the voter whose answer became final; sums to 1). With ground truth:
      ``workflow/regraded/generator`` (share of voter outputs right), ``workflow/any_correct`` (share of episodes
      with at least one right voter), ``workflow/pass@<k>`` for ``k = 1 .. n_voters`` (unbiased pass@k over the
      episode's voters, averaged over episodes; ``pass@n_voters == any_correct``), ``workflow/selection_accuracy``
      (among episodes with a right voter, the share whose aggregator picked a right one).
    - ``EvalOpt``: generator call ``i`` is judged by evaluator call ``i``. ``workflow/iterations``: mean generator
      calls per episode; ``workflow/retry_rate``: share of episodes with more than one generator call;
      ``workflow/verdict_correct_rate`` / ``..._incorrect_rate`` / ``..._unparseable_rate``: shares of evaluator
      outputs whose ``parse_verdict`` is True / False / None (they sum to 1); ``role/generator/unparseable``;
      ``role/evaluator/unparseable`` (no verdict, equal to ``verdict_unparseable_rate``). With ground truth:
      ``workflow/regraded/generator`` (share of all generator attempts right), ``workflow/verdict_accuracy`` (share
      of verdicts that are right: Correct iff the judged attempt is right; no verdict counts as Incorrect, since
      Eval-Opt retries on it).
    - ``OrchWorkers``: ``role/orchestrator/unparseable`` (fewer ``STRATEGY k:`` than ``n_workers``, so fallback
      strategies were assigned); ``role/worker/unparseable``; ``role/synthesizer/unparseable``. With ground truth:
      ``workflow/regraded/worker``, ``workflow/regraded/synthesizer``, and ``workflow/any_correct`` and
      ``workflow/pass@<k>`` (``k = 1 .. n_workers``) over the workers.

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

    grade = None
    if answer_checker is not None:

        def grade(i: int, call: ModelCall) -> bool:
            return bool(answer_checker(call.text, answers[i]))

    if isinstance(workflow, Voting):
        metrics.update(_voting_metrics(workflow, episodes, grade))
    elif isinstance(workflow, EvalOpt):
        metrics.update(_eval_opt_metrics(workflow, episodes, grade))
    elif isinstance(workflow, OrchWorkers):
        metrics.update(_orch_workers_metrics(workflow, episodes, grade))
    elif isinstance(workflow, SingleAgent):
        metrics.update(_single_agent_metrics(episodes, grade))
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


def _voting_metrics(workflow: Voting, episodes: Sequence[Episode], grade: Grader) -> dict[str, float]:
    picks = [0] * workflow.n_voters
    unreadable: dict[str, list[bool]] = defaultdict(list)
    graded = _Graded()
    selection_right = []
    for i, episode in enumerate(episodes):
        voters = _calls(episode, "generator")
        unreadable["generator"] += [not _has_answer(call.text, workflow.task) for call in voters]
        aggregator = _calls(episode, "aggregator")
        index = None
        if voters and aggregator:
            index, parsed = parse_selection(aggregator[-1].text, len(voters))
            unreadable["aggregator"].append(not parsed)
            picks[index] += 1
        if grade is not None and voters:
            right = [grade(i, call) for call in voters]
            graded.add_group("generator", right)
            if index is not None and any(right):
                selection_right.append(right[index])
    metrics = _unparseable_metrics(unreadable) | graded.metrics()
    if sum(picks):
        metrics |= {f"workflow/selection/{k + 1}": count / sum(picks) for k, count in enumerate(picks)}
    if selection_right:
        metrics["workflow/selection_accuracy"] = _share(selection_right)
    return metrics


def _eval_opt_metrics(workflow: EvalOpt, episodes: Sequence[Episode], grade: Grader) -> dict[str, float]:
    iterations, verdicts, verdict_right = [], [], []
    unreadable: dict[str, list[bool]] = defaultdict(list)
    graded = _Graded()
    for i, episode in enumerate(episodes):
        attempts, reviews = _calls(episode, "generator"), _calls(episode, "evaluator")
        if not attempts:
            continue
        iterations.append(len(attempts))
        said = [parse_verdict(call.text) for call in reviews]
        verdicts += said
        unreadable["generator"] += [not _has_answer(call.text, workflow.task) for call in attempts]
        unreadable["evaluator"] += [verdict is None for verdict in said]
        if grade is not None:
            right = [grade(i, call) for call in attempts]
            graded.add("generator", right)
            verdict_right += [(verdict is True) == ok for verdict, ok in zip(said, right)]
    metrics = _unparseable_metrics(unreadable) | graded.metrics()
    if iterations:
        metrics["workflow/iterations"] = statistics.fmean(iterations)
        metrics["workflow/retry_rate"] = _share(n > 1 for n in iterations)
    if verdicts:
        metrics["workflow/verdict_correct_rate"] = _share(v is True for v in verdicts)
        metrics["workflow/verdict_incorrect_rate"] = _share(v is False for v in verdicts)
        metrics["workflow/verdict_unparseable_rate"] = _share(v is None for v in verdicts)
    if verdict_right:
        metrics["workflow/verdict_accuracy"] = _share(verdict_right)
    return metrics


def _orch_workers_metrics(workflow: OrchWorkers, episodes: Sequence[Episode], grade: Grader) -> dict[str, float]:
    unreadable: dict[str, list[bool]] = defaultdict(list)
    graded = _Graded()
    for i, episode in enumerate(episodes):
        unreadable["orchestrator"] += [
            len(parse_strategies(call.text, workflow.n_workers)) < workflow.n_workers
            for call in _calls(episode, "orchestrator")
        ]
        workers, synthesizer = _calls(episode, "worker"), _calls(episode, "synthesizer")
        unreadable["worker"] += [not _has_answer(call.text, workflow.task) for call in workers]
        unreadable["synthesizer"] += [not _has_answer(call.text, workflow.task) for call in synthesizer]
        if grade is not None:
            if workers:
                graded.add_group("worker", [grade(i, call) for call in workers])
            graded.add("synthesizer", [grade(i, call) for call in synthesizer])
    return _unparseable_metrics(unreadable) | graded.metrics()


def _single_agent_metrics(episodes: Sequence[Episode], grade: Grader) -> dict[str, float]:
    unreadable: dict[str, list[bool]] = defaultdict(list)
    graded = _Graded()
    for i, episode in enumerate(episodes):
        answers = _calls(episode, "generator")
        unreadable["generator"] += [not _has_answer(call.text, None) for call in answers]
        if grade is not None:
            graded.add("generator", [grade(i, call) for call in answers])
    return _unparseable_metrics(unreadable) | graded.metrics()


class _Graded:
    """Right/wrong per answering role; for parallel roles also per episode group (any correct, pass@k)."""

    def __init__(self) -> None:
        self.right: dict[str, list[bool]] = defaultdict(list)
        self.groups: list[list[bool]] = []

    def add(self, role: str, right: list[bool]) -> None:
        self.right[role] += right

    def add_group(self, role: str, right: list[bool]) -> None:
        self.add(role, right)
        self.groups.append(right)

    def metrics(self) -> dict[str, float]:
        metrics = {f"workflow/regraded/{role}": _share(right) for role, right in self.right.items() if right}
        if self.groups:
            metrics["workflow/any_correct"] = _share(any(group) for group in self.groups)
            for k in range(1, max(len(group) for group in self.groups) + 1):
                # An episode with fewer than k instances (a crashed call) cannot give pass@k; it is left out.
                values = [_pass_at_k(len(g), sum(g), k) for g in self.groups if len(g) >= k]
                metrics[f"workflow/pass@{k}"] = statistics.fmean(values)
        return metrics


def _unparseable_metrics(unreadable: dict[str, list[bool]]) -> dict[str, float]:
    return {f"role/{role}/unparseable": _share(flags) for role, flags in unreadable.items() if flags}


def _calls(episode: Episode, role: str) -> list[ModelCall]:
    """The episode's calls of one role type: parallel instances by instance, sequential calls in call order."""
    return sorted((call for call in episode.calls if call.role == role), key=lambda call: call.instance)


def _has_answer(text: str, task: str | None) -> bool:
    if task == "math":
        return last_boxed(text) is not None
    if task == "code":
        return last_code_block(text) is not None
    return last_boxed(text) is not None or last_code_block(text) is not None


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): chance that k of the n samples, c of them right, include a right one."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(flags) / len(flags)
