"""Which role's training brought the gain: each of a run's adapters switched between trained and base.

A run's final checkpoint is evaluated with every subset S of its adapters trained and the rest routed to the base
model (``role_policies``), on the same problems, seeds and settings; v(S) is the success rate. With k adapters:

- k <= 4: all 2^k subsets, and each adapter's exact Shapley share of the gain v(N) - v({}):
  phi_i = sum over S not holding i of |S|! (k - |S| - 1)! / k! * (v(S + i) - v(S)); the shares sum to the gain.
- k > 4: only the empty and full sets, each adapter alone (add-one-in: v({i}) - v({})) and each left out
  (leave-one-out: v(N) - v(N - i)), and phi_i ~ their mean, which is the Shapley value whenever the roles interact
  at most in pairs (it is exact for k = 2).

The interaction term is the part of the gain no adapter brings alone: v(N) - v({}) - sum_i (v({i}) - v({})).
Intervals: resample problems with replacement (each problem keeps its outcome in every subset), recompute every
number, take the central percentiles. Each subset is an ordinary evaluation row in ``eval_results.jsonl`` (its key
holds the subset as ``role_policies`` and every setting), so a subset already evaluated is read, not run again.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters.routing import unique_adapters
from ..checkpoints import read_multiagent_config, workflow_from_config
from ..tasks import get_task
from ..workflows import Workflow
from .bootstrap import bootstrap_over_problems
from .evaluator import EvalSettings, describe, evaluate
from .modes import plan_mode
from .results import key_hash, problem_success, read_results, result_key
from .run_checkpoints import list_checkpoints

EXACT_UP_TO = 4  # adapters; 2^4 = 16 evaluations
Coalition = frozenset[str]  # the adapters kept trained; the others' roles go to the base model


def coalitions(players: Sequence[str]) -> list[Coalition]:
    """The subsets to evaluate: all of them for at most ``EXACT_UP_TO`` players; else the empty and full sets, each
    player alone and each player left out."""
    players = list(players)
    if len(players) <= EXACT_UP_TO:
        return [frozenset(c) for size in range(len(players) + 1) for c in itertools.combinations(players, size)]
    full = frozenset(players)
    return [frozenset(), full, *(frozenset([p]) for p in players), *(full - {p} for p in players)]


def shapley(values: Mapping[Coalition, float], players: Sequence[str]) -> dict[str, float]:
    """Each player's Shapley share of ``values[full] - values[empty]``: exact when every subset is in ``values``,
    else the mean of its add-one-in and leave-one-out effects (see the module docstring)."""
    k, full, empty = len(players), frozenset(players), frozenset()
    if k <= EXACT_UP_TO:
        shares = {}
        for player in players:
            others = [p for p in players if p != player]
            share = 0.0
            for size in range(k):
                weight = math.factorial(size) * math.factorial(k - size - 1) / math.factorial(k)
                for subset in itertools.combinations(others, size):
                    share += weight * (values[frozenset(subset) | {player}] - values[frozenset(subset)])
            shares[player] = share
        return shares
    return {p: 0.5 * ((values[frozenset([p])] - values[empty]) + (values[full] - values[full - {p}])) for p in players}


def interaction(values: Mapping[Coalition, float], players: Sequence[str]) -> float:
    """The gain no player brings alone: ``v(N) - v({}) - sum_i (v({i}) - v({}))``."""
    empty = frozenset()
    alone = sum(values[frozenset([p])] - values[empty] for p in players)
    return values[frozenset(players)] - values[empty] - alone


def attribution(
    per_problem: Mapping[Coalition, Sequence[float]],
    players: Sequence[str],
    *,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Shapley shares, interaction and gain from each subset's per-problem success (same problems, same order), with
    percentile intervals over ``bootstrap`` resamplings of the problems."""
    subsets = coalitions(players)
    missing = [sorted(s) for s in subsets if s not in per_problem]
    if missing:
        raise ValueError(f"Attribution over {list(players)} needs the subsets {missing} too.")
    table = np.array([per_problem[s] for s in subsets], dtype=float)  # [subsets, problems]
    if table.ndim != 2 or table.shape[1] == 0:
        raise ValueError("Every subset needs the same, non-zero number of per-problem outcomes.")

    def summary(columns: np.ndarray) -> dict[str, float]:
        values = dict(zip(subsets, columns.mean(axis=1)))
        full, empty = values[frozenset(players)], values[frozenset()]
        return {**shapley(values, players), "interaction": interaction(values, players), "gain": full - empty}

    intervals = bootstrap_over_problems(table, summary, bootstrap=bootstrap, confidence=confidence, seed=seed)
    n = table.shape[1]
    means = table.mean(axis=1)
    return {
        "players": list(players),
        "method": "shapley" if len(players) <= EXACT_UP_TO else "add_one_in_leave_one_out",
        "shares": {p: intervals[p] for p in players},
        "interaction": intervals["interaction"],
        "gain": intervals["gain"],
        "subsets": [{"trained": sorted(s), "success": float(m)} for s, m in zip(subsets, means)],
        "num_problems": n,
        "bootstrap": bootstrap,
        "confidence": confidence,
    }


def run_attribution(
    run_dir: str | Path,
    settings: EvalSettings | None = None,
    *,
    output_dir: str | Path | None = None,
    workflow: Workflow | None = None,
    bootstrap: int = 1000,
) -> dict[str, Any]:
    """Evaluate the final checkpoint of ``run_dir`` with every subset of its adapters trained (the others' roles on
    the base model), skipping subsets already in ``eval_results.jsonl``; the attribution, also written to
    ``<output_dir>/attribution-step<N>-<settings hash>.json``."""
    settings = settings or EvalSettings()
    output_dir = Path(output_dir if output_dir is not None else run_dir)
    step, checkpoint = list_checkpoints(run_dir)[-1]
    config = read_multiagent_config(checkpoint)
    workflow = workflow or workflow_from_config(config["workflow"])
    mapping = {role: config["role_to_adapter"][role] for role in workflow.roles if role in config["role_to_adapter"]}
    players = unique_adapters(mapping)
    num_problems = len(get_task(settings.task).eval_dataset(settings.dataset_name, settings.limit))
    per_problem, evaluated, rows = {}, 0, {}
    for subset in coalitions(players):
        policies = {role: "base" for role, adapter in mapping.items() if adapter not in subset}
        plan = plan_mode("trained", str(checkpoint), workflow, role_policies=policies)
        key = result_key(describe(plan, settings, step, checkpoint, num_problems))
        evaluated += len(evaluate(checkpoint, "trained", settings, output_dir, workflow, role_policies=policies))
        (row,) = [r for r in read_results(output_dir) if result_key(r) == key][-1:]
        per_problem[subset], rows[subset] = problem_success(row), row
    result = attribution(per_problem, players, bootstrap=bootstrap, seed=settings.seed)
    full = rows[frozenset(players)]
    result.update(
        run=str(run_dir),
        step=step,
        workflow=full["workflow"],
        policy_sharing=full["policy_sharing"],
        roles={adapter: [r for r, a in mapping.items() if a == adapter] for adapter in players},
        settings_key=key_hash({**full, "role_policies": None}),
        temperature=settings.temperature,
        k=settings.k,
        evaluated=evaluated,
    )
    path = output_dir / f"attribution-step{step}-{result['settings_key']}.json"
    path.write_text(json.dumps(result, indent=1))
    return result


def format_attribution(result: dict[str, Any]) -> str:
    """A markdown table: each adapter's share of the gain (points of success) with its interval, the interaction
    and the gain."""
    pct = round(100 * result["confidence"])
    lines = [
        f"{result['workflow']} ({result['policy_sharing']}), {result['run']} step {result['step']}: "
        f"{result['num_problems']} problems, {describe_sampling(result)}, {result['method']}, {pct}% bootstrap "
        "intervals over problems",
        "",
        f"| adapter (roles) | share pp [{pct}% interval] | share of gain |",
        "| --- | --- | --- |",
    ]
    gain = result["gain"]["value"]
    for player, share in result["shares"].items():
        fraction = f"{share['value'] / gain:.0%}" if gain else "-"
        roles = ", ".join(result["roles"][player])
        lines.append(f"| {player} ({roles}) | {_interval(share)} | {fraction} |")
    lines.append(f"| interaction | {_interval(result['interaction'])} | - |")
    lines.append(f"| gain (all trained - all base) | {_interval(result['gain'])} | 100% |")
    success = ", ".join(f"{'+'.join(s['trained']) or 'none'}: {100 * s['success']:.1f}%" for s in result["subsets"])
    return "\n".join(lines) + f"\n\nSuccess with the trained adapters: {success}\n"


def describe_sampling(result: dict[str, Any]) -> str:
    """``greedy`` or ``k=4 at temperature 0.7``: how the subsets' episodes were sampled."""
    if "k" not in result:
        return "sampling not recorded"
    return "greedy" if result["temperature"] == 0 else f"k={result['k']} at temperature {result['temperature']}"


def _interval(entry: dict[str, float]) -> str:
    return f"{100 * entry['value']:+.1f} [{100 * entry['low']:+.1f}, {100 * entry['high']:+.1f}]"
