"""Draw docs/images/toy_residuals.png, the figure of docs/toy.md, from docs/data/toy_residuals.csv.

    python scripts/toy_residuals.py                     # needs matplotlib (pip install -e ".[plots]")
    python scripts/toy_residuals.py --out /tmp/toy_residuals.png

The CSV holds, per task family, training budget and sampling (greedy, or pass@1 over 4 samples at T=0.7), the numbers
of the Eval-Opt isolated line of the toy grid's tables in docs/toy-records.md (records G1-G4, G11, G12: success of each
run's newest checkpoint on 100 held-out problems, the mean over seeds 1-3, residuals with their 95% paired bootstrap
interval over problems). Per family the figure shows, in points of success:

- what the workflow's shape gives before any training: the untrained model in Eval-Opt minus the untrained model in
  one pass (no interval: greedy decoding gives the same answers at every seed, and the records keep no per-problem
  outcomes of the difference);
- what training every role together adds over single-agent RL in the same workflow, the paper's residual: trained
  Eval-Opt minus the single-agent adapter in every Eval-Opt role, at each budget the records measured.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "toy_residuals.csv"
OUT = ROOT / "docs" / "images" / "toy_residuals.png"
FAMILIES = {"mod_search": "mod_search (toy-search)", "arithmetic": "arithmetic (toy)", "toy_code": "toy_code (toy)"}
BUDGETS = (30, 100, 200)  # training steps the grid was run at
SAMPLINGS = {"pass@1": ("o", "pass@1, 4 samples at T=0.7"), "greedy": ("s", "greedy")}  # marker, legend


def read_rows(path: Path = DATA) -> list[dict]:
    with path.open() as f:
        return [
            {k: v if k in ("family", "model", "sampling", "record") else float(v) for k, v in row.items()}
            for row in csv.DictReader(f)
        ]


def draw(rows: list[dict], out: Path) -> Path:
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    # 9 inches wide with 12-point text: readable where a docs page shows it at about 700 pixels.
    style = {
        "font.size": 12,
        "axes.titlesize": 13,
        "legend.fontsize": 12,
        "xtick.labelsize": 12,
        "ytick.labelsize": 12,
    }
    with rc_context(style):
        figure = Figure(figsize=(9, 5.2), dpi=100, layout="constrained")
        axes = figure.subplots(1, len(FAMILIES), sharey=True)
        for ax, (family, title) in zip(axes, FAMILIES.items()):
            ours = [row for row in rows if row["family"] == family]
            for offset, (sampling, (marker, _)) in zip((-0.12, 0.12), SAMPLINGS.items()):
                shape = next(row for row in ours if row["sampling"] == sampling)
                gain = shape["base_workflow"] - shape["base_single"]
                ax.plot(0 + offset, gain, marker, color="0.35", markersize=8)
                for x, steps in enumerate(BUDGETS, start=1):
                    found = [r for r in ours if r["steps"] == steps and r["sampling"] == sampling]
                    if not found:
                        continue
                    (row,) = found
                    error = [[row["residual"] - row["residual_low"]], [row["residual_high"] - row["residual"]]]
                    ax.errorbar(
                        x + offset, row["residual"], yerr=error, fmt=marker, color="C0", markersize=8, capsize=4
                    )
            for x, steps in enumerate(BUDGETS, start=1):
                found = [row for row in ours if row["steps"] == steps]
                if not found:
                    ax.text(x, 1, "not\nmeasured", ha="center", va="bottom", fontsize=11, color="0.5", rotation=90)
                    continue
                top = max(row["residual_high"] for row in found)  # the record, once above both points
                ax.annotate(
                    found[0]["record"],
                    (x, top),
                    textcoords="offset points",
                    xytext=(0, 5),
                    ha="center",
                    fontsize=11,
                    color="0.4",
                )
            ax.axhline(0, color="0.5", linewidth=1)
            ax.axvline(0.5, color="0.8", linewidth=1)
            ax.set_xticks(range(len(BUDGETS) + 1), ["0", *(str(steps) for steps in BUDGETS)])
            ax.set_xlabel("training steps")
            ax.set_xlim(-0.5, len(BUDGETS) + 0.5)
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.25)
        axes[0].set_ylabel("points of success")
        handles = [
            Line2D([], [], color="0.35", marker="o", linestyle="", markersize=8, label="shape: untrained"),
            Line2D([], [], color="C0", marker="o", linestyle="", markersize=8, label="residual [95% interval]"),
            *(
                Line2D([], [], color="black", marker=m, linestyle="", markersize=8, label=t)
                for m, t in SAMPLINGS.values()
            ),
        ]
        figure.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
        figure.suptitle("Eval-Opt against single-agent RL on three toy families")
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="The CSV (default: %(default)s).")
    parser.add_argument("--out", type=Path, default=OUT, help="The PNG (default: %(default)s).")
    args = parser.parse_args()
    print(draw(read_rows(args.data), args.out))


if __name__ == "__main__":
    main()
