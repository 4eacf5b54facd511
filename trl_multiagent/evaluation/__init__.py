"""Evaluation: rebuild trained workflows, score them on a task's test split (pass@1, pass@k), tabulate and plot.

- ``evaluate(run_dir, mode, settings)``: every checkpoint of a run -> rows in ``eval_results.jsonl`` + episode JSON;
- ``paper_table(rows)``: peak (and step), final, drop from peak, residual vs SA-RL per cell;
- ``role_instability(read_log_history(run_dir))``: per-role policy ratio, gradient norm and entropy summaries;
- ``plot_accuracy`` / ``plot_role_metric`` (``plots.py``, needs matplotlib).
"""

from ..monitoring.pass_at_k import pass_at_k
from .datasets import eval_dataset, task_reward
from .evaluator import EvalSettings, evaluate, list_checkpoints, score
from .instability import read_log_history, role_instability, role_series
from .modes import MODES, ModePlan, plan_mode
from .results import RESULTS_FILE, read_results
from .table import accuracy_curves, format_table, paper_table

__all__ = [
    "MODES",
    "RESULTS_FILE",
    "EvalSettings",
    "ModePlan",
    "accuracy_curves",
    "eval_dataset",
    "evaluate",
    "format_table",
    "list_checkpoints",
    "paper_table",
    "pass_at_k",
    "plan_mode",
    "read_log_history",
    "read_results",
    "role_instability",
    "role_series",
    "score",
    "task_reward",
]
