"""Build docs/data/alarm_corpus.csv, the runs an early-warning alarm is judged on: every logged step of every run.

    python scripts/alarm_corpus.py                                  # from the shipped CSVs
    python scripts/alarm_corpus.py --collect outputs/alarm-corpus    # first collect the new runs' folders

Reads the toy records' CSVs (docs/data/toy_amplification.csv: records M1-M3; docs/data/toy_capture.csv: record M4;
docs/toy-records.md has their commands) and the new runs' (docs/data/alarm_new_runs.csv), which `--collect` writes
from each run folder's `log_history` (its `trainer_state.json`, or its newest checkpoint's when it stopped early),
`multiagent_config.json` and `training_args.bin`. The new runs of docs/monitoring.md's table were trained with

    for seed in 2 3; do  # stopped at steps 30 and 35 (killed: fallen to 0 success; the checkpoints hold the logs)
      trl-multiagent train voting --config toy --n_voters 3 --update_schedule mini_batches --learning_rate 4e-3 \
        --per_device_train_batch_size 16 --seed $seed --max_steps 60 --save_steps 5 --save_only_model true \
        --monitor_update_size true --output_dir outputs/alarm-corpus/voting-n3-mini_batches-lr4e-3-s$seed
    done
    for seed in 2 3; do
      trl-multiagent train voting --config toy --n_voters 3 --update_schedule mini_batches --learning_rate 2e-3 \
        --per_device_train_batch_size 16 --seed $seed --max_steps 50 --save_steps 5 --save_only_model true \
        --monitor_update_size true --output_dir outputs/alarm-corpus/voting-n3-mini_batches-lr2e-3-s$seed
    done
    for seed in 1 4; do  # stopped at the session's end (docs/monitoring.md says at which step)
      trl-multiagent train voting --config toy --n_voters 3 --update_schedule mini_batches --learning_rate 2e-3 \
        --per_device_train_batch_size 16 --seed $seed --max_steps 100 --save_steps 5 --save_only_model true \
        --monitor_update_size true --output_dir outputs/alarm-corpus/voting-n3-mini_batches-lr2e-3-s$seed
    done

(`--learning_rate 1e-2` made both seeds' voters collapse within 4 steps, before any running mean of success exists:
not a decline any alarm could precede; those runs are not in the corpus.)

The slower declines (lr 1.5e-3, seeds 5-9, `docs/data/alarm_slow_declines.csv`) and the hour of
`benchmarks/long_run.py` (`docs/data/alarm_long_run.csv`) were added on 2026-12-08; docs/monitoring.md gives their
commands, each collected with ``--collect <its folder> --new_runs <its CSV> <the other two CSVs>``.

One row per (run, step, role, metric): `success` (role empty), per role the update size and the loss's ratio
(`update_ratio`, `update_chi_square`, `policy_ratio`, `chi_square`), `grad_norm`, `entropy`, `completion_length`,
shares of a shared adapter's gradient (`gradient_share`), the judges' accuracies, and each drift alarm the run logged
(`alarm/<kind>`, value 1 at its step). `source` names the record (M1-M4, or `new`), `setting` the run's knobs.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from trl_multiagent.cli.report import load_training_args
from trl_multiagent.evaluation.instability import read_log_history
from trl_multiagent.evaluation.mechanisms import alarm_steps, step_series

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
OUT = DATA / "alarm_corpus.csv"
# The new runs' rows, collected once from their folders: the runs made to decline (2026-12-07, then the slower ones of
# 2026-12-08), and benchmarks/long_run.py's hour.
NEW_RUNS = (DATA / "alarm_new_runs.csv", DATA / "alarm_slow_declines.csv", DATA / "alarm_long_run.csv")
COLUMNS = ("run", "source", "workflow", "setting", "seed", "step", "role", "metric", "value")
# The per-role metrics kept from a run folder's log.
ROLE_METRICS = (
    "update_ratio",
    "update_chi_square",
    "policy_ratio",
    "chi_square",
    "grad_norm",
    "entropy",
    "completion_length",
    "grad_norm_share",
    "verdict_accuracy",
    "verdict_balanced_accuracy",
    "selection_accuracy",
)
RENAMED = {"grad_norm_share": "gradient_share"}  # toy_capture.csv's name for it


def amplification_rows(path: Path) -> list[dict]:
    """Records M1 (the Voting sweep), M2 (the Orch-Workers sweep) and M3 (the long run)."""
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            source = "M3" if row["part"] == "long" else {"Voting": "M1", "OrchWorkers": "M2"}[row["workflow"]]
            setting = f"isolated, {row['instances']} instances, {row['schedule']}, lr 1e-3"
            rows.append(
                {
                    "run": f"{source}-{row['workflow']}-n{row['instances']}-{row['schedule']}-s{row['seed']}",
                    "source": source,
                    "workflow": row["workflow"],
                    "setting": setting,
                    "seed": row["seed"],
                    "step": row["step"],
                    "role": row["role"],
                    "metric": row["metric"],
                    "value": row["value"],
                }
            )
    return rows


def capture_rows(path: Path) -> list[dict]:
    """Record M4: shared Voting and Eval-Opt, per-output averaging against equalised role shares."""
    keep = {"success", "entropy", "completion_length", "gradient_share", "verdict_balanced_accuracy"}
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            metric, role = row["metric"], row["role"]
            if row["metric"] in ("verdict_accuracy", "selection_accuracy"):  # logged per judge, kept without a role
                role = {"EvalOpt": "evaluator", "Voting": "aggregator"}[row["workflow"]]
            elif metric not in keep and not metric.startswith("alarm/"):
                continue
            rows.append(
                {
                    "run": f"M4-{row['workflow']}-shared-{row['balance']}-s{row['seed']}",
                    "source": "M4",
                    "workflow": row["workflow"],
                    "setting": f"shared, {row['balance']}, lr 1e-3",
                    "seed": row["seed"],
                    "step": row["step"],
                    "role": role,
                    "metric": metric,
                    "value": row["value"],
                }
            )
    return rows


def _saved_file(run_dir: Path, name: str) -> Path:
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    for folder in (run_dir, *checkpoints):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{run_dir} holds no {name}, nor any checkpoint of it.")


def run_folder_rows(run_dir: Path) -> list[dict]:
    """Every logged step of one run folder (finished, or stopped after a checkpoint)."""
    config = json.loads(_saved_file(run_dir, "multiagent_config.json").read_text())
    args = load_training_args(_saved_file(run_dir, "training_args.bin"))
    history = read_log_history(run_dir)
    workflow = config["workflow"]["workflow"]
    instances = config["workflow"].get("n_voters", config["workflow"].get("n_workers", ""))
    run = {
        "run": f"new-{run_dir.name}",
        "source": "new",
        "workflow": workflow,
        "setting": ", ".join(
            [config.get("policy_sharing", "isolated")]
            + ([f"{instances} instances"] if instances else [])
            + [args.update_schedule, f"lr {args.learning_rate:g}"]
        ),
        "seed": args.seed,
    }
    rows = [
        {**run, "step": s, "role": "", "metric": "success", "value": v}
        for s, v in step_series(history, "workflow/success")
    ]
    for role in config["role_to_adapter"]:
        for metric in ROLE_METRICS:
            points = step_series(history, f"role/{role}/{metric}")
            name = RENAMED.get(metric, metric)
            rows += [{**run, "step": s, "role": role, "metric": name, "value": v} for s, v in points]
    rows += [
        {**run, "step": s, "role": role, "metric": f"alarm/{kind}", "value": 1.0}
        for s, role, kind in alarm_steps(history)
    ]
    return rows


def run_folders(root: Path) -> list[Path]:
    states = [*root.glob("*/trainer_state.json"), *root.glob("*/checkpoint-*/trainer_state.json")]
    return sorted({state.parent if state.parent.parent == root else state.parent.parent for state in states})


def write(rows: list[dict], out: Path) -> Path:
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "value": f"{float(row['value']):.6g}"})
    return out


def collect(roots: list[Path], out: Path = NEW_RUNS[0]) -> Path:
    """Write the new runs' rows, from the run folders under ``roots``, to their own CSV."""
    return write([row for root in roots for run_dir in run_folders(root) for row in run_folder_rows(run_dir)], out)


def build(out: Path = OUT, new_runs: tuple[Path, ...] = NEW_RUNS) -> Path:
    """The corpus: the toy records' rows and the new runs' (each of their CSVs that exists)."""
    # Records M1 and M2 (4-8 steps a run) are too short to decline (scripts/alarm_lead.py's MIN_STEPS): left out.
    rows = [row for row in amplification_rows(DATA / "toy_amplification.csv") if row["source"] == "M3"]
    rows += capture_rows(DATA / "toy_capture.csv")
    for path in new_runs:
        if path.is_file():
            with path.open() as f:
                rows += list(csv.DictReader(f))
    return write(rows, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", type=Path, nargs="*", default=None, help="roots of new run folders")
    parser.add_argument(
        "--new_runs", type=Path, nargs="+", default=NEW_RUNS, help="the new runs' CSVs (--collect writes the first)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.collect is not None:
        print(f"wrote {collect(args.collect, args.new_runs[0])}")
    print(f"wrote {build(args.out, args.new_runs)}")


if __name__ == "__main__":
    main()
