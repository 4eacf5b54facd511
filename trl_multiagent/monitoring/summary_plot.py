"""The summary picture: what a person looks for in a run, over its steps, from the trainer's log history.

Panels, in this order, each in words with its unit:

- success: each step's value as a point and its running mean as a line;
- per role: completion length (tokens per call), entropy of the sampled tokens (nats per token), and the role's share
  of the step's gradient norm;
- per judge role (a role whose declared output format is a verdict or a selection, ``judge_roles``): how often its
  verdict is right and its balanced accuracy (the mean of its accuracy on right and on wrong answers), or how often
  its selection picks a right answer when there is one;
- per role: outputs cut at the length cap, outputs not in the declared format, KL to the base model and tokens
  clipped by the ratio bound.

A panel whose values carry no information in this run is left out: no finite value, or the same value at every
step, which is what the run's settings make of a metric that cannot move under them (no tokens clipped with one
optimizer step per generation batch, no code blocks on a math task) or a value that did not move in this run. A note
under the picture names each panel left out and why. Success is always drawn: a flat success is the news.

Drift alarms (the ``alarm/<role>/<kind>`` keys ``RoleDriftCallback`` adds to the log history) are vertical lines in
every panel, named with their steps in the legend. Non-finite values (NaN: nothing to measure that step) and steps
that did not log a metric are skipped, never drawn as 0.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .drift import JUDGE_KINDS

SUCCESS = "workflow/success"
SELECTION_ACCURACY = "workflow/selection_accuracy"  # the workflow's, one per episode: workflows have one selector
WIDTH, PANEL_HEIGHT = 13.0, 3.1  # inches: at 100 dpi, 1,300 pixels wide
# Alarm lines, one style per (kind, role): dashed, in colours the roles' lines (C0, C1, ...) do not take first.
ALARM_STYLES = [(colour, dash) for dash in ("--", "-.", ":") for colour in ("#b2182b", "#5e3c99", "#333333")] * 3
_ALARM = re.compile(r"^alarm/(?P<role>[^/]+)/(?P<kind>.+)$")

Series = list[tuple[int, float]]  # (global step, logged value), finite values only, in logging order


def judge_roles(formats: Mapping[str, Any]) -> dict[str, str]:
    """Role -> ``"verdict"`` or ``"selection"`` for the roles whose declared output format (``Workflow.formats``:
    format objects, or their ``kind`` strings) is a judgement of other roles' answers."""
    kinds = {role: fmt if isinstance(fmt, str) else getattr(fmt, "kind", None) for role, fmt in formats.items()}
    return {role: kind for role, kind in kinds.items() if kind in JUDGE_KINDS}


def logged_judges(log_history: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The verdict roles a log history shows (``role/<role>/verdict_accuracy`` is logged for verdict roles only),
    for a history whose workflow's declarations are not at hand. A selection role logs nothing of its own, so it is
    not found here."""
    keys = dict.fromkeys(key for entry in log_history for key in entry)
    found = (re.fullmatch(r"role/(?P<role>[^/]+)/verdict_accuracy", key) for key in keys)
    return {match["role"]: "verdict" for match in found if match}


@dataclass(frozen=True)
class Alarm:
    step: int
    role: str
    kind: str


def logged_alarms(log_history: Sequence[dict[str, Any]]) -> list[Alarm]:
    """Every drift alarm in the log history, in the order it fired."""
    return [
        Alarm(entry.get("step", 0), match["role"], match["kind"])
        for entry in log_history
        for key in entry
        if (match := _ALARM.match(key))
    ]


def finite_series(log_history: Sequence[dict[str, Any]]) -> dict[str, Series]:
    """Every numeric key -> its finite values over steps (NaN, inf, None and booleans skipped)."""
    series: dict[str, Series] = {}
    for entry in log_history:
        step = entry.get("step", 0)
        for key, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            series.setdefault(key, []).append((step, float(value)))
    return series


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """Each value's centred mean over ``window`` neighbours (fewer at the ends)."""
    half = window // 2
    return [
        sum(values[max(0, i - half) : i + half + 1]) / len(values[max(0, i - half) : i + half + 1])
        for i in range(len(values))
    ]


def smoothing_window(points: int) -> int:
    """An odd window of about a tenth of the run's logged steps; 1 (no smoothing) below 15 points."""
    window = max(1, round(points / 10))
    return window + 1 if window % 2 == 0 else window


@dataclass
class Panel:
    """One panel: its title and y-axis in words, and label -> series (a role's, or a named line)."""

    title: str
    ylabel: str
    lines: dict[str, Series]  # label -> series: a role's name in a per-role panel, else what the line is
    shares: bool = False  # a fraction of a whole (success, a share, an accuracy): the y-axis spans [0, 1]
    rate: bool = False  # a rate of rare events (truncations, format failures): the y-axis starts at 0
    role: str | None = None  # a judge's panel: the role, whose colour its lines take
    per_role: bool = False  # a line per role, named by the figure's legend
    styles: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> plot keywords (a dash)
    chance: float | None = None  # a dotted reference line (a balanced accuracy's 0.5)
    flat_is_news: bool = False  # drawn even when its value never moves (success: a run that does not learn)

    def blank(self) -> str | None:
        """Why the panel carries no information: no finite value, or (unless ``flat_is_news``) the same value at
        every step; None if it does."""
        values = [value for series in self.lines.values() for _, value in series]
        if not values:
            return "no finite value"
        if not self.flat_is_news and max(values) - min(values) <= 1e-9 * max(1.0, abs(max(values))):
            return f"{_number(values[0])} at every step"
        return None


# Per-role panels: (metric, title, y-axis, scale: "share" spans [0, 1], "rate" starts at 0, None follows the data);
# the first before the judges' panels, the others after them.
ROLE_PANELS = (
    ("completion_length", "Completion length", "tokens per call", None),
    ("entropy", "Entropy of the sampled tokens", "nats per token", None),
    ("grad_norm_share", "Share of the step's gradient norm", "share (roles sum to 1)", "share"),
)
MORE_ROLE_PANELS = (
    ("truncated_fraction", "Outputs cut at the length cap", "share of calls", "rate"),
    ("unparseable", "Outputs not in the declared format", "share of calls", "rate"),
    ("kl", "KL to the base model", "nats per token", "rate"),
    ("clip_fraction", "Tokens clipped by the ratio bound", "share of tokens", "rate"),
)


def summary_panels(
    log_history: Sequence[dict[str, Any]], judges: Mapping[str, str] | None = None
) -> tuple[list[Panel], list[str]]:
    """The panels to draw, and a line for each one left out (its title and why). ``judges``: role -> kind
    (``judge_roles``); ``None`` finds the verdict roles in the log (``logged_judges``)."""
    series = finite_series(log_history)
    logged = dict.fromkeys(key for entry in log_history for key in entry)  # NaN-only keys included
    roles = list(dict.fromkeys(key.split("/")[1] for key in logged if key.startswith("role/") and key.count("/") >= 2))
    judges = logged_judges(log_history) if judges is None else dict(judges)

    def role_panel(metric: str, title: str, ylabel: str, scale: str | None) -> Panel | None:
        keys = {role: f"role/{role}/{metric}" for role in roles if f"role/{role}/{metric}" in logged}
        lines = {role: series.get(key, []) for role, key in keys.items()}
        return Panel(title, ylabel, lines, scale == "share", scale == "rate", per_role=True) if keys else None

    candidates: list[Panel | None] = []
    if SUCCESS in logged:
        success = {"success": series.get(SUCCESS, [])}
        candidates.append(Panel("Success", "share of episodes solved", success, shares=True, flat_is_news=True))
    candidates += [role_panel(*spec) for spec in ROLE_PANELS]
    for role, kind in judges.items():
        candidates.append(_judge_panel(role, kind, series, logged))
    candidates += [role_panel(*spec) for spec in MORE_ROLE_PANELS]
    panels, left_out = [], []
    for panel in filter(None, candidates):
        why = panel.blank()
        if why is None:
            panels.append(panel)
        else:
            left_out.append(f"{panel.title.lower()}: {why}")
    return panels, left_out


def _judge_panel(role: str, kind: str, series: dict[str, Series], logged: Mapping[str, Any]) -> Panel | None:
    if kind == "selection":
        if SELECTION_ACCURACY not in logged:
            return None
        lines = {"picks a right answer": series.get(SELECTION_ACCURACY, [])}
        return Panel(f"Judge {role}: selection right", "share of selections", lines, shares=True, role=role)
    accuracy, balanced = f"role/{role}/verdict_accuracy", f"role/{role}/verdict_balanced_accuracy"
    if accuracy not in logged:
        return None
    lines = {"verdict right": series.get(accuracy, [])}
    styles = {}
    if balanced in logged:
        lines["balanced accuracy"] = series.get(balanced, [])
        styles["balanced accuracy"] = {"linestyle": "--"}
    title = f"Judge {role}: verdicts right"
    return Panel(title, "share of verdicts", lines, shares=True, role=role, styles=styles, chance=0.5)


def plot_summary(
    log_history: Sequence[dict[str, Any]],
    path: str,
    *,
    judges: Mapping[str, str] | None = None,
    columns: int = 3,
    title: str | None = None,
) -> str | None:
    """Save the summary picture of ``log_history`` to ``path`` (PNG); ``None`` (nothing written) when no
    ``workflow/...`` or ``role/<role>/...`` metric was logged. ``judges``: role -> ``"verdict"`` / ``"selection"``
    (``judge_roles(workflow.formats)``); ``None`` finds the verdict roles in the log."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure  # the object API: no pyplot state, no global backend switch
    from matplotlib.ticker import MaxNLocator

    panels, left_out = summary_panels(log_history, judges)
    if not panels:
        return None
    alarms = logged_alarms(log_history)
    judging = [panel.role for panel in panels if panel.role]
    roles = [role for panel in panels if panel.per_role for role in panel.lines]
    roles = list(dict.fromkeys([*(role for role in roles if role not in judging), *judging]))  # solvers first
    colours = {role: f"C{i % 10}" for i, role in enumerate(roles)}
    alarm_styles = dict(zip(dict.fromkeys((a.kind, a.role) for a in alarms), ALARM_STYLES))
    steps = max((step for panel in panels for s in panel.lines.values() for step, _ in s), default=0)
    columns = min(columns, len(panels))
    rows = math.ceil(len(panels) / columns)
    note = _wrap("Not drawn: " + "; ".join(left_out) + ".", 150) if left_out else ""
    footer = 0.25 * (note.count("\n") + 1) if note else 0.0  # inches
    height = (
        PANEL_HEIGHT * rows + 0.8 + 0.22 * math.ceil(len(alarm_styles) / 2) + footer
    )  # the title and legends above the panels
    style = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10}
    with rc_context({**style, "xtick.labelsize": 10, "ytick.labelsize": 10}):
        figure = Figure(figsize=(WIDTH, height), dpi=100, layout="constrained")
        axes = figure.subplots(rows, columns, squeeze=False).flatten()
        for ax, panel in zip(axes, panels):
            _draw(ax, panel, colours)
            for alarm in alarms:
                colour, dash = alarm_styles[alarm.kind, alarm.role]
                ax.axvline(alarm.step, color=colour, linestyle=dash, linewidth=1.5, alpha=0.9)
            ax.set_title(panel.title)
            ax.set_xlabel("training step")
            ax.set_ylabel(panel.ylabel)
            ax.set_xlim(0, max(steps, 1) * 1.01)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
            ax.grid(alpha=0.25)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        # The title, the legends and the note sit outside the panels' layout, which fills the space between them.
        header = title or f"Training summary: {steps} steps"
        figure.text(0.5, 1 - 0.1 / height, header, fontsize=14, ha="center", va="top")
        top = 1 - 0.45 / height
        for handles, ncol in ((_line_handles(colours, panels), 8), (_alarm_handles(alarms, alarm_styles), 2)):
            if handles:
                legend = figure.legend(
                    handles=handles, loc="upper center", bbox_to_anchor=(0.5, top), ncol=ncol, frameon=False
                )
                figure.draw_without_rendering()  # to measure it: what comes next starts below it
                top = legend.get_window_extent().transformed(figure.transFigure.inverted()).y0
        if note:
            figure.text(0.01, 0.08 / height, note, fontsize=10, color="0.3", va="bottom")
        bottom = footer / height
        figure.get_layout_engine().set(rect=(0, bottom, 1, top - 0.05 / height - bottom), h_pad=0.1, w_pad=0.15)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        figure.savefig(path)
    return path


def _line_handles(colours: Mapping[str, str], panels: Sequence[Panel]) -> list:
    """The legend of the lines: a colour per role; each step faint, the running mean bold."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour, linewidth=2.5, label=role) for role, colour in colours.items()]
    window = max(smoothing_window(len(s)) for panel in panels for s in panel.lines.values())
    if window > 1:
        handles.append(Line2D([], [], color="0.4", alpha=0.35, label="each step"))
        handles.append(Line2D([], [], color="0.2", linewidth=2, label=f"running mean over about {window} steps"))
    return handles


def _alarm_handles(alarms: Sequence[Alarm], styles: Mapping[tuple[str, str], tuple[str, str]]) -> list:
    """The legend of the alarms: one entry per (kind, role), with the steps it fired at."""
    from matplotlib.lines import Line2D

    handles = []
    for (kind, role), (colour, dash) in styles.items():
        fired = [str(a.step) for a in alarms if (a.kind, a.role) == (kind, role)]
        label = f"drift alarm {kind} ({role}) at step{'s' if len(fired) > 1 else ''} {', '.join(fired)}"
        handles.append(Line2D([], [], color=colour, linestyle=dash, linewidth=1.5, label=label))
    return handles


def _draw(ax, panel: Panel, colours: Mapping[str, str]) -> None:
    """Draw each line of ``panel``: its values faint (success: points), their running mean bold."""
    for label, series in panel.lines.items():
        if not series:
            continue
        steps, values = zip(*series)
        colour = colours[label] if panel.per_role else colours.get(panel.role, "0.15")
        window = smoothing_window(len(values))
        keywords = panel.styles.get(label, {})
        if not panel.per_role and panel.role is None:  # success: one series, its points
            ax.scatter(steps, values, s=12, color=colour, alpha=0.35, linewidths=0)
        elif window > 1:
            ax.plot(steps, values, color=colour, linewidth=0.8, alpha=0.3, **keywords)
        line_label = None if panel.per_role else label
        marker = "o" if len(values) < 10 else None  # a short run: each step's value is the line's point
        ax.plot(
            steps, running_mean(values, window), color=colour, linewidth=2, marker=marker, label=line_label, **keywords
        )
    if panel.chance is not None:
        ax.axhline(panel.chance, color="0.5", linestyle=":", linewidth=1.2, label="chance (balanced)")
    if panel.shares:
        ax.set_ylim(-0.03, 1.03)
    elif panel.rate:
        ax.set_ylim(bottom=0)
    if panel.role is not None:
        ax.legend(loc="best")


def _number(value: float) -> str:
    return f"{value:.4g}"


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))
