"""Evaluation: run loaded workflows, score them on a task's test split (pass@1, pass@k), tabulate and plot.

- ``evaluate(run_dir, mode, settings)``: every checkpoint of a run -> rows in ``eval_results.jsonl`` + episode JSON
  (success: ``workflows.correctness.solved``, a task reward of at least 1); ``toy.py`` is the same evaluator on the
  toy tasks, with per-role format and quality;
- ``run_episodes(trained, prompts, make_generation_config(trained, max_new_tokens))``: a workflow loaded by
  ``trl_multiagent.checkpoints`` run through the trainer's rollout engine and backends;
- ``paper_table(rows)``: peak (and step), final, drop from peak, residual vs SA-RL per cell;
- ``family_table(rows)``: a task family over seeds, residuals vs SA-RL with paired bootstrap intervals over problems
  (``bootstrap.py``, shared with the per-role attribution);
- ``role_instability(read_log_history(run_dir))``: per-role policy ratio, gradient norm and entropy summaries;
- ``mechanisms.py``: the paper's two mechanisms read from logged metrics (update sizes per role and update, role
  shares of a shared adapter's gradient, outputs and tokens, the rise and peak of success, intervals over seeds);
- ``plot_accuracy`` / ``plot_role_metric`` (``plots.py``, needs matplotlib).
"""

from ..common.deprecation import moved_names
from ..monitoring.pass_at_k import pass_at_k
from .evaluator import EvalSettings, evaluate, final_answer_rewards, sample_episodes, score
from .generation import eos_token_ids, make_generation_config, run_episodes
from .instability import read_log_history, role_instability, role_series
from .modes import MODES, ModePlan, parse_role_policies, plan_mode
from .results import RESULTS_FILE, read_results
from .run_checkpoints import list_checkpoints
from .table import accuracy_curves, family_table, format_family_table, format_table, paper_table

__all__ = [
    "MODES",
    "RESULTS_FILE",
    "EvalSettings",
    "ModePlan",
    "accuracy_curves",
    "eos_token_ids",
    "evaluate",
    "family_table",
    "final_answer_rewards",
    "format_family_table",
    "format_table",
    "list_checkpoints",
    "make_generation_config",
    "paper_table",
    "parse_role_policies",
    "pass_at_k",
    "plan_mode",
    "read_log_history",
    "read_results",
    "role_instability",
    "role_series",
    "run_episodes",
    "sample_episodes",
    "score",
]

# Names that moved out of this package still work until they are removed, with a warning (deprecation.MOVED).
__getattr__ = moved_names(__name__)
