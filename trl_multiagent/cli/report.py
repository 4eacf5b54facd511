"""`trl-multiagent report RUN_DIR`: one self-contained HTML page about a finished (or stopped) run, from its folder.

    trl-multiagent report outputs/toy-eval-opt                    # writes outputs/toy-eval-opt/report.html
    trl-multiagent report outputs/toy-eval-opt --output /tmp/r.html

The page holds, from what the run folder keeps: the workflow and the settings that differ from the library's defaults
(``multiagent_config.json``, ``training_args.bin``), the summary picture (drawn again from the log history, embedded
as a PNG), the first -> last table of every workflow and per-role metric (the one printed when training ends), the
drift alarms with their steps, and, where they exist, the run's evaluations (``eval_results.jsonl``) and attributions
(``attribution-step<N>-<key>.json``). It needs no network and loads nothing from elsewhere: it can be mailed or kept.
"""

from __future__ import annotations

import argparse
import base64
import enum
import html
import importlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..checkpoints import CONFIG_NAME, read_multiagent_config, workflow_from_config
from ..checkpoints.workflow_config import IMPORT_PATH
from ..evaluation.instability import read_log_history
from ..evaluation.results import read_results
from ..monitoring.alarm_advice import alarm_advice
from ..monitoring.drift import alarm_meaning
from ..monitoring.summary import first_last
from ..monitoring.summary_plot import judge_roles, logged_alarms, plot_summary

REPORT_FILE = "report.html"
ARGS_FILE = "training_args.bin"  # what the Trainer saves: its arguments, pickled
# training_args.bin is a pickle: only these packages' classes are rebuilt from it (torch's weights_only loader refuses
# anything else), so reading a run folder never runs code it names.
TRUSTED_MODULES = ("transformers.", "trl.", "trl_multiagent.", "accelerate.")


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the run's report (default ``<run_dir>/report.html``) and return its path."""
    run_dir = Path(run_dir)
    path = Path(output) if output is not None else run_dir / REPORT_FILE
    path.write_text(report_html(run_dir), encoding="utf-8")
    return path


def report_html(run_dir: str | Path) -> str:
    """The page, as one HTML string with the picture inline."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder; pass a run's output_dir.")
    history = read_log_history(run_dir)
    if not history:
        raise FileNotFoundError(
            f"{run_dir} has no trainer_state.json, in it or in a checkpoint-N folder: pass a run's output_dir "
            "(training writes it there when it ends, and into every checkpoint)."
        )
    config = _run_config(run_dir)
    workflow, workflow_note = _workflow(config)
    sections = [
        _section("Run", _run_table(run_dir, config, history) + workflow_note),
        _section("Settings that differ from the defaults", _settings_section(run_dir)),
        _section("Summary picture", _picture(history, workflow)),
        _section("First -> last", _first_last_section(history)),
        _section("Drift alarms", _alarms_section(history)),
    ]
    evaluations = read_results(run_dir)
    if evaluations:
        sections.append(_section("Evaluations", _evaluations_table(evaluations)))
    for attribution in sorted(run_dir.glob("attribution-step*-*.json")):
        result = json.loads(attribution.read_text())
        sections.append(_section(f"Attribution at step {result['step']}", _attribution_table(result)))
    title = f"Run report: {run_dir.resolve().name}"
    return _PAGE.format(title=html.escape(title), body="\n".join(sections))


def _run_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``multiagent_config.json``: in the folder, or in its newest checkpoint."""
    for folder in [run_dir, *sorted(run_dir.glob("checkpoint-*"), key=_step, reverse=True)]:
        if (folder / CONFIG_NAME).is_file():
            return read_multiagent_config(folder)
    return None


def _workflow(config: dict[str, Any] | None):
    """The run's workflow rebuilt from its config (its judges get their panels), and a note when it is not.

    Only this package's workflows are rebuilt: the saved import path of another names a module that importing would
    run, and a report reads a folder without running code from it."""
    if config is None:
        return None, _note(f"No {CONFIG_NAME} here: the workflow is unknown; judges are found in the log.")
    path = config["workflow"].get(IMPORT_PATH)
    if path is not None and not path.startswith("trl_multiagent."):
        return None, _note(f"The workflow {path} is not imported by the report; judges are found in the log.")
    try:
        return workflow_from_config(config["workflow"]), ""
    except (ValueError, TypeError) as error:  # saved by a version with other workflows or parameters
        return None, _note(f"The workflow is not rebuilt here ({error}); judges are found in the log.")


def _run_table(run_dir: Path, config: dict[str, Any] | None, history: list[dict[str, Any]]) -> str:
    state_steps = max((entry.get("step", 0) for entry in history), default=0)
    rows = [("folder", str(run_dir.resolve())), ("steps logged", str(state_steps))]
    if config is not None:
        workflow = {key: value for key, value in config["workflow"].items() if key != IMPORT_PATH}
        name = workflow.pop("workflow", "?")
        rows += [
            ("workflow", f"{name}({', '.join(f'{k}={v!r}' for k, v in workflow.items())})"),
            ("base model", str(config.get("base_model"))),
            ("policy sharing", str(config.get("policy_sharing"))),
            ("role -> adapter", ", ".join(f"{r} -> {a}" for r, a in config.get("role_to_adapter", {}).items())),
        ]
        if config.get("role_models"):
            rows.append(("role -> base model", ", ".join(f"{r} -> {m}" for r, m in config["role_models"].items())))
    return _table(["", ""], rows, header=False)


def load_training_args(path: str | Path):
    """The Trainer's arguments from ``training_args.bin``, rebuilt without running code from the file: torch's
    ``weights_only`` loader, allowed only the classes of ``TRUSTED_MODULES`` the file names."""
    import torch

    allowed = []
    for name in torch.serialization.get_unsafe_globals_in_checkpoint(str(path)):
        module, _, attribute = name.rpartition(".")
        found = getattr(importlib.import_module(module), attribute) if name.startswith(TRUSTED_MODULES) else None
        if not isinstance(found, type):
            raise ValueError(
                f"{path} names {name}, which is not a class of {', '.join(m.rstrip('.') for m in TRUSTED_MODULES)}: "
                "the report does not unpickle it (a pickle runs the code it names)."
            )
        allowed.append(found)
    with torch.serialization.safe_globals(allowed):
        return torch.load(str(path), weights_only=True)


def settings_diff(args) -> list[tuple[str, Any, Any]]:
    """``(field, the run's value, the default)`` for each field of the run's config that differs from the library's
    defaults: the same config class built with no arguments but the run's ``output_dir`` and ``use_cpu`` (the
    defaults of some fields depend on the device: bf16 on a CPU)."""
    defaults = type(args)(output_dir=args.output_dir, use_cpu=args.use_cpu).to_dict()
    run = args.to_dict()
    return [(name, value, defaults.get(name)) for name, value in run.items() if value != defaults.get(name)]


def _settings_section(run_dir: Path) -> str:
    found = [run_dir / ARGS_FILE] + [p / ARGS_FILE for p in sorted(run_dir.glob("checkpoint-*"), key=_step)[::-1]]
    path = next((p for p in found if p.is_file()), None)
    if path is None:
        return _note(f"No {ARGS_FILE} here or in a checkpoint: the settings are unknown.")
    try:
        args = load_training_args(path)
        changed = settings_diff(args)
    except (ValueError, TypeError) as error:  # a class not rebuilt, or defaults that cannot be built on this machine
        return _note(f"The settings are not shown: {error}")
    rows = [(name, _value(value), _value(default)) for name, value, default in changed]
    device = f"<p>Trained on {'CPU' if args.use_cpu else 'the accelerator'} ({html.escape(type(args).__name__)}, read "
    device += f"from {html.escape(str(path.relative_to(run_dir)))}).</p>"
    return device + _table(["setting", "this run", "default"], rows)


def _picture(history: list[dict[str, Any]], workflow) -> str:
    judges = None if workflow is None else judge_roles(workflow.formats)
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = plot_summary(history, str(Path(folder) / "summary.png"), judges=judges)
        except ImportError:
            return _note("No picture: it needs matplotlib (pip install matplotlib).")
        if path is None:
            return _note("No workflow/... or role/<role>/... metric was logged: nothing to draw.")
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    alt = "Training summary: success, each role's length, entropy and gradient share, each judge's accuracy, alarms"
    return f'<img class="summary" alt="{alt}" src="data:image/png;base64,{data}">'


def _first_last_section(history: list[dict[str, Any]]) -> str:
    table = first_last(history)
    if table is None:
        return _note("No workflow/... or role/<role>/... metric was logged.")
    intro = (
        f"<p>The mean of the first -> last {table.window} logged values of each metric, over {table.steps} steps.</p>"
    )
    parts = [intro, _table(["workflow metric", "first -> last"], table.workflow)] if table.workflow else [intro]
    if table.role_rows:
        parts.append(_table(["role metric", *table.roles], table.role_rows))
    return "\n".join(parts)


def _alarms_section(history: list[dict[str, Any]]) -> str:
    alarms = logged_alarms(history)
    if not alarms:
        return "<p>No drift alarm fired.</p>"
    rows = [(str(a.step), a.role, a.kind, alarm_meaning(a.kind), alarm_advice(a.kind, a.role)) for a in alarms]
    return _table(["step", "role", "alarm", "what it means", "what to do"], rows)


def _evaluations_table(rows: list[dict[str, Any]]) -> str:
    body = []
    for row in rows:
        mode = row["mode"] + (f" ({row['role_policies']})" if row.get("role_policies") else "")
        mode += f", best of {row['best_of']} ({row.get('select')})" if row.get("best_of") else ""
        sampling = "greedy" if row.get("temperature") == 0 else f"k={row.get('k')} at T={row.get('temperature')}"
        body.append(
            (
                str(row["step"]),
                f"{row['workflow']} ({row.get('policy_sharing') or '-'})",
                mode,
                str(row.get("dataset")),
                str(row.get("num_problems")),
                sampling,
                f"{100 * row['accuracy']:.1f}",
                f"{row['mean_calls']:.2f}" if "mean_calls" in row else "",
            )
        )
    columns = ["step", "workflow", "mode", "dataset", "problems", "sampling", "success %", "calls per episode"]
    return _table(columns, body)


def _attribution_table(result: dict[str, Any]) -> str:
    pct = round(100 * result["confidence"])
    gain = result["gain"]["value"]
    rows = [
        (
            f"{adapter} ({', '.join(result['roles'][adapter])})",
            _points(share),
            f"{share['value'] / gain:.0%}" if gain else "-",
        )
        for adapter, share in result["shares"].items()
    ]
    rows += [
        ("interaction", _points(result["interaction"]), "-"),
        ("gain: all trained - all base", _points(result["gain"]), "100%"),
    ]
    intro = f"<p>{result['num_problems']} problems, {result['method']}, {pct}% bootstrap intervals over problems.</p>"
    return intro + _table(["adapter (roles)", f"share, points [{pct}% interval]", "share of the gain"], rows)


def _points(entry: dict[str, float]) -> str:
    return f"{100 * entry['value']:+.1f} [{100 * entry['low']:+.1f}, {100 * entry['high']:+.1f}]"


def _value(value: Any) -> str:
    value = value.value if isinstance(value, enum.Enum) else value
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _step(folder: Path) -> int:
    suffix = folder.name.rpartition("-")[2]
    return int(suffix) if suffix.isdigit() else -1


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], header: bool = True) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _section(title: str, content: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>\n{content}\n</section>"


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1320px; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.95em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }}
th {{ background: #f0f0f5; }}
img.summary {{ max-width: 100%; height: auto; }}
.note {{ color: #666; }}
</style>
</head>
<body>
<h1>{title}</h1>
{body}
</body>
</html>
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trl-multiagent report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="A run's output_dir (the folder training wrote).")
    parser.add_argument("--output", help=f"Where the page goes (default: RUN_DIR/{REPORT_FILE}).")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.run_dir, args.output)
    except FileNotFoundError as error:
        print(f"trl-multiagent report: {error}", file=sys.stderr)
        return 2
    print(f"Wrote {path}")
    return 0
