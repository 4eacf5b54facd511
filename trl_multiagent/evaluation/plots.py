"""PNG plots (matplotlib, Agg backend): accuracy vs step per cell, and per-role training curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .instability import role_series
from .table import CELL_FIELDS, accuracy_curves

_LABELS = {
    "base": "{workflow} base",
    "trained": "{workflow} {policy_sharing}",
    "transfer": "{workflow} SA-RL (transfer)",
    "generator_alone": "{trained_workflow} {policy_sharing}: generator alone",
}


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("Plots need matplotlib: pip install matplotlib.") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """One line per cell (workflow, sharing, mode); single-step cells (base) as dashed horizontal lines."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 5))
    for cell, points in sorted(accuracy_curves(rows).items(), key=lambda item: str(item[0])):
        values = dict(zip(CELL_FIELDS, cell))
        label = _LABELS[values["mode"]].format(**values)
        if values["role_policies"]:
            label += f" ({values['role_policies']})"
        if len(cell) > len(CELL_FIELDS):  # a best-of-n evaluation: (n, selection)
            label += " best-of-{} ({})".format(*cell[-1])
        steps, accuracies = zip(*points)
        if len(points) == 1 and values["mode"] == "base":
            axes.axhline(100 * accuracies[0], linestyle="--", linewidth=1, label=label)
        else:
            axes.plot(steps, [100 * a for a in accuracies], marker="o", markersize=3, label=label)
    axes.set(xlabel="step", ylabel="accuracy (%)", ylim=(0, 100), title=title)
    axes.legend(fontsize=7)
    return _save(plt, figure, path)


def plot_role_metric(log_history: list[dict[str, Any]], metric: str, path: str | Path, title: str = "") -> Path | None:
    """``role/<role>/<metric>`` vs step, one line per role; ``None`` (no file) when the run did not log it."""
    series = role_series(log_history, metric)
    if not series:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 5))
    for role, points in sorted(series.items()):
        steps, values = zip(*points)
        axes.plot(steps, values, label=role)
    axes.set(xlabel="step", ylabel=metric, title=title)
    axes.legend(fontsize=8)
    return _save(plt, figure, path)


def _save(plt, figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_attribution(results: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """One panel per attribution (``attribution.run_attribution``): each adapter's share of the gain and the
    interaction, in points of success, with their bootstrap intervals; the whole gain as a dashed line."""
    from .attribution import describe_sampling

    plt = _pyplot()
    figure, panels = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.5), squeeze=False)
    for axes, result in zip(panels[0], results):
        entries = [*result["shares"].items(), ("interaction", result["interaction"])]
        labels = [name for name, _ in entries]
        values = [100 * e["value"] for _, e in entries]
        errors = [
            [100 * (e["value"] - e["low"]) for _, e in entries],
            [100 * (e["high"] - e["value"]) for _, e in entries],
        ]
        axes.barh(labels, values, xerr=errors, capsize=4, color=["C0"] * len(result["shares"]) + ["C7"])
        axes.axvline(100 * result["gain"]["value"], linestyle="--", color="k", linewidth=1, label="gain")
        axes.axvline(0, color="k", linewidth=0.5)
        axes.invert_yaxis()
        heading = f"{result['workflow']} ({result['policy_sharing']}), {describe_sampling(result)}"
        axes.set(xlabel="share of the gain (points of success)", title=heading)
        axes.legend(fontsize=7)
    if title:
        figure.suptitle(title)
    return _save(plt, figure, path)
