"""Extract the drift-relevant metrics of toy preset runs into tests/fixtures/toy_preset_logs.json.

The drift-alarm tests replay these logs: the toy presets' normal runs must raise no alarm. Re-recorded on the
current toy model (2026-12-01) with

    for run in single_agent:40 voting:15 orch_workers:25; do
        wf=${run%:*} n=${run#*:}
        trl-multiagent train $wf --config toy --max_steps $n --save_steps $n --output_dir outputs/presets/$wf
    done
    python scripts/toy_preset_logs.py outputs/presets/*/checkpoint-*/trainer_state.json

(step counts for time; eval_opt is the README's first command, all 100 steps, written to outputs/presets/eval_opt:
`accelerate launch --config_file accelerate_configs/cpu.yaml recipes/eval_opt_math.py --config
recipes/configs/toy.yaml --output_dir outputs/presets/eval_opt`, the run of record T7 in docs/toy.md.)
"""

import json
import sys
from pathlib import Path

KEEP = ("words_median", "completion_length", "truncated_fraction", "code_block_fraction", "perplexity", "entropy")
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "toy_preset_logs.json"


def drift_metrics(entry: dict) -> dict[str, float]:
    keep = {k: v for k, v in entry.items() if k == "workflow/success" or (k.startswith("role/") and k.endswith(KEEP))}
    return {k: float(f"{v:.4g}") for k, v in keep.items()}


if __name__ == "__main__":
    runs = {}
    for path in map(Path, sys.argv[1:]):
        history = json.loads(path.read_text())["log_history"]
        runs[path.parent.parent.name] = [drift_metrics(e) for e in history if "workflow/success" in e]
    source = "trl-multiagent train <workflow> --config toy --max_steps N (seed 0); see scripts/toy_preset_logs.py"
    blocks = [f"{json.dumps(name)}: [\n" + ",\n".join(map(json.dumps, logs)) + "\n]" for name, logs in runs.items()]
    OUT.write_text(f'{{"source": {json.dumps(source)},\n"runs": {{\n' + ",\n".join(blocks) + "\n}}\n")  # a step a line
    print(f"{OUT}: " + ", ".join(f"{name} {len(logs)} steps" for name, logs in runs.items()))
