"""Train and evaluate the paper's grid: workflow x policy sharing x model x task family (x seed), plus base-model and
SA-RL controls.

Every cell is one `accelerate launch recipes/<workflow>_<task>.py` with the same seed and budget; the SA-RL control
is `single_agent_<task>` per model, family and seed. Then every checkpoint is evaluated (`recipes/evaluate.py`):
each cell, the base model in each workflow, the SA-RL run alone and in each workflow ("transfer"). Finally the
tables (per cell: peak accuracy and its step, final accuracy, drop from peak, residual vs SA-RL in points; per
family: the residuals with their intervals, below), per-role instability summaries and plots go to
`<output_root>/`.

See the commands without running anything:

    python recipes/grid.py --dry-run

Paper grid (one GPU per run, sequentially; 3 workflows x 2 sharings x 3 models x 2 tasks + controls):

    python recipes/grid.py --output_root runs/grid --eval_args "--k 4 --temperature 0.7"

CPU, offline: `--preset toy` stands for the toy model, the toy families, the CPU launch config, 30 steps with a
checkpoint every 10, evaluations on 100 held-out problems at 80 tokens per call (greedy at every checkpoint, pass@1
over 4 samples at T=0.7 at the newest) and `outputs/grid-toy`; any flag given with it wins over the preset's value:

    python recipes/grid.py --preset toy --dry-run                # every launch and evaluation
    python recipes/grid.py --preset toy --seeds 1 2 3            # 3 seeds, each under <family>/seed-N/

Task families (`--families`): a family is a task trained with one recipe config and evaluated on one dataset, on a
model. Named families: `arithmetic` (math task, `arithmetic` dataset, recipes/configs/toy.yaml), `toy_code` (code
task, `toy_code`, toy_code.yaml), both on `--models`; and `mod_search` (math task, its `mod_search` dataset, toy.yaml
at 40 tokens per call, one check: the budget is part of the task), on the shipped `toy-search` model, which is
trained on it (the toy model is not; docs/toy.md):

    python recipes/grid.py --preset toy --families mod_search --seeds 1 2 3 --workflows eval_opt \
        --policy_sharing isolated

An entry is `NAME` or `NAME:key=value,...` with the keys task, dataset, train_dataset, recipe_config, model (a local
model folder, or a shipped toy model's name) and max_completion_length; a name not listed above needs task=. Without
`--families` the grid is `--models` x `--tasks`, each task a family of its own (`--recipe_config` and
`--eval_dataset` per task), as in the toy grid's records in docs/toy.md (one evaluation per checkpoint, sampled as
recipes/configs/paper_eval.yaml sets, T=0.7):

    python recipes/grid.py --models toy --tasks math code --accelerate_config accelerate_configs/cpu.yaml \
        --recipe_config math=recipes/configs/toy.yaml code=recipes/configs/toy_code.yaml \
        --eval_dataset math=arithmetic code=toy_code --max_steps 30 --save_steps 10 \
        --eval_args "--limit 100 --max_completion_length 80" --output_root outputs/grid-toy

On a SLURM cluster (`pip install -e '.[slurm]'` in the clone): every training is an element of one job array, every
evaluation a job that starts once the trainings it reads succeeded; a preempted or timed-out training is requeued and
resumes from its newest complete checkpoint. Re-submitting skips finished trainings and finished evaluations:

    python recipes/grid.py --launcher slurm --partition gpu --gpus_per_run 8 \
        --accelerate_config accelerate_configs/multi_gpu.yaml --output_root runs/grid

`--attribution` adds, per isolated cell, which role's training brought the gain (`recipes/evaluate.py --attribution`:
each role's Shapley share with bootstrap intervals over problems; `<output_root>/attribution.md` and
`plots/attribution-<model>-<family>.png`).

The family table (`<output_root>/families.md`, `families.json`; the paper's Table 1 layout), per family and model:
a line per trained workflow x sharing, SA-RL, SA-RL in each workflow and the base model in each workflow; per
sampling setting evaluated (greedy; pass@1 over k samples) the success of each run's newest evaluated checkpoint as
the mean ± sample standard deviation over seeds, and each trained workflow's residual (its success minus SA-RL's, in
points) against SA-RL alone and against SA-RL in the same workflow, with a 95% paired bootstrap interval over
problems (1,000 resamplings): both sides are evaluated on the same problems; seeds are pooled per problem (each
problem's success averaged over the seeds both sides have), then problems are resampled, so the interval is over
problems at these seeds, while the ± column shows the spread between seeds. The newest checkpoint, not the peak: a
peak chosen on the same problems would bias the residual. The cost-matched baseline: per workflow cell and sampled
setting, SA-RL evaluated with `--best_of_calls <cell> --select majority` (each episode the majority answer of n
samples, n the cell's measured calls per episode rounded up; run after the cells' evaluations), the line "SA-RL
best-of-n (majority)" and each workflow's residual against the best-of-n matching its calls ("vs SA-RL best-of-n").
For each Eval-Opt cell also `--select judge --judge <cell>`: n SA-RL samples each judged by that cell's trained
evaluator, the majority among the accepted answers graded (n more calls per episode), the line "SA-RL best-of-n
(judge: EvalOpt <sharing>)" and the cell's "vs SA-RL judged best-of-n".

Re-running skips finished trainings (a run's final `multiagent_config.json`) and evaluations already recorded;
`--report_only` only rebuilds the tables and plots from what is there.
"""

import contextlib
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tqdm.auto import tqdm
from trl import TrlParser

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.cli.shipped import read_preset
from trl_multiagent.common.model_names import registered_model_names
from trl_multiagent.config.multiagent_grpo_config import POLICY_SHARINGS
from trl_multiagent.evaluation import (
    EvalSettings,
    family_table,
    format_family_table,
    format_table,
    paper_table,
    read_log_history,
    read_results,
    role_instability,
)
from trl_multiagent.tasks import TASKS
from trl_multiagent.tasks.mod_search import ONE_CHECK_TOKENS

ROOT = Path(__file__).resolve().parent.parent
SA_RL = "single_agent"
JUDGED = "eval_opt"  # the workflow whose evaluator also chooses among SA-RL's samples (the judged best-of-n)
READS = ("--run_dir", "--workflow", "--best_of_calls", "--judge")  # an evaluation's flags naming the runs it reads


@dataclass(frozen=True)
class Family:
    """A task family: ``task``'s recipes trained with ``recipe_config`` (on ``train_dataset`` when set, else the
    config's dataset) and evaluated on ``dataset`` (None: the task's own), on ``model`` (None: each of --models)."""

    name: str
    task: str
    dataset: str | None = None
    train_dataset: str | None = None
    recipe_config: str | None = None
    model: str | None = None
    # Tokens per model call in its training and evaluations when the family sets its own (after --eval_args, so it
    # wins): part of the task where the budget is what keeps one pass from solving it (mod_search).
    max_completion_length: int | None = None


FAMILIES = {
    "arithmetic": Family("arithmetic", "math", "arithmetic", "arithmetic", "recipes/configs/toy.yaml"),
    "toy_code": Family("toy_code", "code", "toy_code", "toy_code", "recipes/configs/toy_code.yaml"),
    "mod_search": Family(
        "mod_search",
        "math",
        "mod_search",
        "mod_search",
        "recipes/configs/toy.yaml",
        model="toy-search",  # the shipped toy model is not trained on mod_search
        max_completion_length=ONE_CHECK_TOKENS,
    ),
}
FAMILY_KEYS = ("task", "dataset", "train_dataset", "recipe_config", "model", "max_completion_length")
# `--preset NAME`: defaults of the grid's flags; a flag given on the command line (or in --config) wins.
PRESETS = {
    "toy": {
        "families": ["arithmetic", "toy_code", "mod_search"],
        "models": ["toy"],
        "accelerate_config": "accelerate_configs/cpu.yaml",
        "max_steps": 30,
        "save_steps": 10,
        "eval_args": "--limit 100 --max_completion_length 80",
        "eval_samplings": ["--temperature 0", "--k 4 --temperature 0.7 --checkpoints final"],
        "output_root": "outputs/grid-toy",
    },
}


@dataclass
class GridArguments:
    workflows: list[str] = field(
        default_factory=lambda: ["eval_opt", "voting", "orch_workers"],
        metadata={"help": "Recipe workflow names (recipes/<workflow>_<task>.py)."},
    )
    policy_sharing: list[str] = field(
        default_factory=lambda: list(POLICY_SHARINGS),
        metadata={"help": "The policy sharings to train, a cell each.", "choices": list(POLICY_SHARINGS)},
    )
    models: list[str] = field(
        default_factory=lambda: ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"], metadata={"help": "Models."}
    )
    tasks: list[str] = field(
        default_factory=lambda: list(TASKS),
        metadata={"help": "Tasks (trl_multiagent.tasks.TASKS).", "choices": list(TASKS)},
    )
    families: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Task families instead of --tasks: NAME (arithmetic, toy_code, mod_search) or "
            "NAME:key=value,... with the keys task, dataset, train_dataset, recipe_config, model (a local model "
            "folder or a shipped toy model's name; without it the family runs on each of --models) and "
            "max_completion_length (tokens per call in its training and evaluations), e.g. "
            "mod_search:model=/path/to/model."
        },
    )
    preset: str | None = field(
        default=None,
        metadata={
            "help": "'toy': the CPU-offline grid (toy model and families, cpu launch config, 30 steps, greedy and "
            "pass@1 evaluations on 100 problems); flags given beside it win.",
            "choices": list(PRESETS),
        },
    )
    output_root: str = field(
        default="runs/grid",
        metadata={"help": "Runs go to <root>/<model>/<family>/<cell> (with --seeds: <family>/seed-N/<cell>)."},
    )
    seed: int = field(default=42, metadata={"help": "Seed of every run and evaluation."})
    seeds: list[int] = field(
        default_factory=list,
        metadata={
            "help": "Run every cell once per seed, each seed's runs under seed-N/ (default: --seed, no seed-N)."
        },
    )
    max_steps: int = field(default=500, metadata={"help": "Training steps of every run (the paper: 500)."})
    save_steps: int = field(default=5, metadata={"help": "Checkpoint (and evaluation) interval (the paper: 5)."})
    accelerate_config: str = field(default="accelerate_configs/single_gpu.yaml", metadata={"help": "Launch config."})
    recipe_config: list[str] = field(
        default_factory=list,
        metadata={"help": "task=path (or family=path): the --config yaml of that task's (family's) recipes."},
    )
    recipe_args: str = field(
        default="", metadata={"help": "Extra flags for every training command (one workflow's only: --workflow_args)."}
    )
    workflow_args: list[str] = field(
        default_factory=list,
        metadata={
            "help": "workflow=flags: extra flags for that workflow's trainings only, after --recipe_args, e.g. "
            'voting="--role_loss_weights \'{\\"aggregator\\": 0.0}\'" (single_agent=...: the SA-RL control\'s).'
        },
    )
    eval_dataset: list[str] = field(
        default_factory=list,
        metadata={"help": "task=name (or family=name): the evaluation dataset (default: the task's own)."},
    )
    eval_args: str = field(default="", metadata={"help": "Extra flags for every evaluation (e.g. '--k 4')."})
    eval_samplings: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Evaluate everything once per entry, each entry's flags after --eval_args, e.g. "
            "'--temperature 0' '--k 4 --temperature 0.7 --checkpoints final' (default: once, --eval_args alone)."
        },
    )
    launcher: str = field(
        default="local",
        metadata={
            "help": "'local': run every command here, one after the other. 'slurm': submit them through submitit "
            "(a job array of trainings, each evaluation a job depending on the trainings it reads) and return.",
            "choices": ["local", "slurm"],
        },
    )
    partition: str | None = field(default=None, metadata={"help": "SLURM partition of every job."})
    gpus_per_run: int = field(
        default=1,
        metadata={
            "help": "GPUs per node of a training (the processes `accelerate launch` starts on each node); 0 on "
            "CPU. More than 1 needs a distributed --accelerate_config (multi_gpu.yaml, deepspeed_zero*.yaml)."
        },
    )
    nodes_per_run: int = field(
        default=1, metadata={"help": "Nodes per training (e.g. 2 with accelerate_configs/multi_node.yaml)."}
    )
    main_process_port: int = field(default=29500, metadata={"help": "Rendezvous port of multi-node trainings."})
    slurm_timeout_min: int = field(
        default=24 * 60, metadata={"help": "Time limit of every SLURM job; a training that hits it is requeued."}
    )
    slurm_parameters: str = field(
        default="{}",
        metadata={"help": 'More sbatch settings as JSON, submitit\'s names: \'{"account": "a", "qos": "high"}\'.'},
    )
    slurm_folder: str | None = field(
        default=None, metadata={"help": "Job scripts, logs and results (default: <output_root>/slurm)."}
    )
    slurm_executor: str = field(
        default="slurm",
        metadata={
            "help": "submitit's executor for --launcher slurm: 'slurm', or 'local' / 'debug' to run the same jobs on "
            "this machine (waits for them and writes the report), e.g. to try a grid before a cluster run.",
            "choices": ["slurm", "local", "debug"],
        },
    )
    attribution: bool = field(
        default=False,
        metadata={
            "help": "Also attribute each isolated cell's gain to its roles (recipes/evaluate.py --attribution, with "
            "--eval_args): a table per workflow with bootstrap intervals, and plots/attribution-<model>-<task>.png."
        },
    )
    dry_run: bool = field(default=False, metadata={"help": "Print the commands; run nothing."})
    report_only: bool = field(default=False, metadata={"help": "Only build the table and plots from existing runs."})


@dataclass
class Cell:
    model: str
    task: str
    workflow: str  # recipe name, or "single_agent" for the SA-RL control
    policy_sharing: str
    run_dir: Path
    family: Family
    seed: int


def named_entries(entries: list[str], flag: str, key: str, example: str) -> dict[str, str]:
    """``key=value`` entries of ``--flag`` as a dict; an entry without ``=`` is an error showing ``example``."""
    pairs = [entry.split("=", 1) for entry in entries]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"--{flag} takes {key}=value entries, e.g. {example}; got {entries}.")
    return dict(pairs)


def parse_family(entry: str) -> Family:
    """``NAME`` or ``NAME:key=value,...`` (see --families) -> a family; a named one takes its defaults from
    ``FAMILIES``."""
    name, _, spec = entry.partition(":")
    fields = dict(pair.split("=", 1) for pair in spec.split(",") if "=" in pair) if spec else {}
    bad = [pair for pair in spec.split(",") if "=" not in pair] if spec else []
    unknown = sorted(set(fields) - set(FAMILY_KEYS))
    if not name or bad or unknown:
        raise ValueError(
            f"--families entry {entry!r}: write NAME or NAME:key=value,... with the keys {', '.join(FAMILY_KEYS)}, "
            "e.g. mod_search:model=/path/to/model."
        )
    if "max_completion_length" in fields:
        if not fields["max_completion_length"].isdigit():
            raise ValueError(f"--families entry {entry!r}: max_completion_length takes a number of tokens.")
        fields["max_completion_length"] = int(fields["max_completion_length"])
    if name in FAMILIES:
        known = FAMILIES[name]
        values = {key: fields.get(key, getattr(known, key)) for key in FAMILY_KEYS}
        return Family(name, **values)
    if "task" not in fields:
        raise ValueError(
            f"--families entry {entry!r}: {name!r} is not one of the named families ({', '.join(FAMILIES)}); "
            f"give its task too, e.g. {name}:task=math,dataset=...,recipe_config=..."
        )
    fields.setdefault("train_dataset", fields.get("dataset"))
    return Family(name, **fields)


def check_family_model(family: Family) -> None:
    """A family's own model must be there: the offline families' models are built here, not downloaded."""
    if family.model is not None and family.model not in registered_model_names():
        if not (Path(family.model) / "config.json").is_file():
            raise FileNotFoundError(
                f"Family {family.name!r}: no model at {family.model} (a folder with config.json, or one of "
                f"{sorted(registered_model_names())}). Build it first, or fix the path in --families."
            )


def grid_families(args: GridArguments) -> list[Family]:
    """--families, or one family per --tasks entry; per-task (or per-family) --recipe_config and --eval_dataset
    entries replace a family's own."""
    configs = named_entries(args.recipe_config, "recipe_config", "task", "math=recipes/configs/cpu.yaml")
    datasets = named_entries(args.eval_dataset, "eval_dataset", "task", "math=arithmetic")
    if args.families:
        families = [parse_family(entry) for entry in args.families]
    else:  # the grid as before families: a task's family is named after it and trains on its config's dataset
        families = [Family(task, task) for task in args.tasks]
    unknown = sorted((set(configs) | set(datasets)) - {f.name for f in families} - set(TASKS))
    if unknown:
        raise ValueError(
            f"--recipe_config / --eval_dataset name {unknown}: neither a task ({', '.join(TASKS)}) nor a family of "
            f"this grid ({', '.join(f.name for f in families)})."
        )
    families = [
        Family(
            family.name,
            family.task,
            datasets.get(family.name, datasets.get(family.task, family.dataset)),
            family.train_dataset,
            configs.get(family.name, configs.get(family.task, family.recipe_config)),
            family.model,
            family.max_completion_length,
        )
        for family in families
    ]
    for family in families:
        if family.task not in TASKS:
            raise ValueError(f"Family {family.name!r}: unknown task {family.task!r} (tasks: {', '.join(TASKS)}).")
        check_family_model(family)
    if len({f.name for f in families}) != len(families):
        raise ValueError(f"--families names a family twice: {[f.name for f in families]}.")
    return families


def grid_cells(args: GridArguments) -> list[Cell]:
    """Per family, model and seed: the SA-RL control first, then every workflow x policy sharing."""
    cells = []
    for family in grid_families(args):
        for model in [family.model] if family.model else args.models:
            folder = Path(args.output_root) / Path(model.rstrip("/")).name / family.name
            for seed in args.seeds or [args.seed]:
                seed_folder = folder / f"seed-{seed}" if args.seeds else folder
                cells.append(Cell(model, family.task, SA_RL, "isolated", seed_folder / SA_RL, family, seed))
                for workflow in args.workflows:
                    for sharing in args.policy_sharing:
                        run_dir = seed_folder / f"{workflow}-{sharing}"
                        cells.append(Cell(model, family.task, workflow, sharing, run_dir, family, seed))
    return cells


def group_key(cell: Cell) -> tuple[str, str, int]:
    """The cells that share controls: one model, family and seed."""
    return cell.model, cell.family.name, cell.seed


def train_command(args: GridArguments, cell: Cell) -> list[str]:
    config, dataset = cell.family.recipe_config, cell.family.train_dataset
    return [
        "accelerate",
        "launch",
        "--config_file",
        args.accelerate_config,
        f"recipes/{cell.workflow}_{cell.task}.py",
        *(["--config", config] if config else []),
        *(["--dataset_name", dataset] if dataset else []),
        "--model_name_or_path",
        cell.model,
        "--output_dir",
        str(cell.run_dir),
        "--policy_sharing",
        cell.policy_sharing,
        "--seed",
        str(cell.seed),
        "--max_steps",
        str(args.max_steps),
        "--save_steps",
        str(args.save_steps),
        *budget(cell.family),
        *shlex.split(args.recipe_args),
        *workflow_flags(args).get(cell.workflow, []),
    ]


def workflow_flags(args: GridArguments) -> dict[str, list[str]]:
    """--workflow_args as workflow -> its trainings' extra flags; a workflow outside this grid is an error, not a
    silently dropped entry."""
    entries = named_entries(args.workflow_args, "workflow_args", "workflow", "voting='--role_loss_weights ...'")
    flags = {workflow: shlex.split(value) for workflow, value in entries.items()}
    unknown = sorted(set(flags) - {SA_RL, *args.workflows})
    if unknown:
        raise ValueError(
            f"--workflow_args names {unknown}: not a workflow of this grid (--workflows {' '.join(args.workflows)}, "
            f"and {SA_RL} for the SA-RL control)."
        )
    return flags


def budget(family: Family) -> list[str]:
    """The family's own tokens per call, as a recipe or evaluate.py flag (none when it keeps the config's)."""
    return (
        [] if family.max_completion_length is None else ["--max_completion_length", str(family.max_completion_length)]
    )


def trained_rendering(config: str | None) -> list[str]:
    """The flags that render evaluation prompts as a recipe config trains them (`chat_rendering` and
    `chat_template_kwargs`; the library defaults where the config leaves them out). Without a config the recipes
    and evaluate.py read the paper presets, which render alike: no flags."""
    if config is None:
        return []
    library = MultiAgentGRPOConfig.__dataclass_fields__
    preset = read_preset(shipped_path(config))  # with the presets it builds on
    rendering = preset.get("chat_rendering", library["chat_rendering"].default)
    template_kwargs = preset.get("chat_template_kwargs", library["chat_template_kwargs"].default)
    return ["--chat_rendering", rendering, "--chat_template_kwargs", json.dumps(template_kwargs)]


def eval_commands(args: GridArguments, cells: list[Cell]) -> list[list[str]]:
    """Each cell's checkpoints; per model, family and seed the base model in each workflow, SA-RL alone and
    transferred; each of them once per --eval_samplings entry."""
    renderings = {config: trained_rendering(config) for config in {cell.family.recipe_config for cell in cells}}
    samplings = [shlex.split(sampling) for sampling in args.eval_samplings] or [[]]

    def command(cell: Cell, *extra: str) -> list[list[str]]:
        dataset = ["--dataset_name", cell.family.dataset] if cell.family.dataset else []
        rendering = renderings[cell.family.recipe_config]
        eval_args = [*shlex.split(args.eval_args), *budget(cell.family)]
        common = ["--task", cell.task, *dataset, *rendering, "--seed", str(cell.seed), *eval_args]
        run = ["python", "recipes/evaluate.py", "--run_dir", str(cell.run_dir), *extra, *common]
        return [run + sampling for sampling in samplings]

    commands = [c for cell in cells for c in command(cell)]
    for sa_rl in (cell for cell in cells if cell.workflow == SA_RL):
        first_per_workflow: dict[str, Cell] = {}  # the workflow is the same under every policy sharing
        for cell in cells:
            if group_key(cell) == group_key(sa_rl) and cell.workflow != SA_RL:
                first_per_workflow.setdefault(cell.workflow, cell)
        commands += command(sa_rl, "--mode", "base")
        for cell in first_per_workflow.values():
            commands += command(cell, "--mode", "base")
            commands += command(sa_rl, "--mode", "transfer", "--workflow", str(cell.run_dir))
    if args.attribution:  # a shared policy is one adapter: nothing to split between roles
        commands += [c for cell in cells if attributed(cell) for c in command(cell, "--attribution")]
    # Last, as they read the workflows' evaluations: SA-RL sampled as often as each workflow cell calls its model
    # (greedy samplings have no best of n); the same n twice is one evaluation (evaluate.py skips the second).
    sa_rl_of = {group_key(cell): cell for cell in cells if cell.workflow == SA_RL}
    for cell in cells:
        if cell.workflow == SA_RL:
            continue
        sa_rl, calls = sa_rl_of[group_key(cell)], ["--best_of_calls", str(cell.run_dir)]
        matched = command(sa_rl, *calls, "--select", "majority")
        if cell.workflow == JUDGED:  # n samples, chosen by the cell's own trained evaluator
            matched += command(sa_rl, *calls, "--select", "judge", "--judge", str(cell.run_dir))
        for c in matched:
            if eval_temperature(c) > 0:
                commands.append(c if "--checkpoints" in c else [*c, "--checkpoints", "final"])
    return commands


def eval_temperature(command: list[str]) -> float:
    """The temperature an evaluation command samples at: its last --temperature, else its --config's, else (no
    --config) recipes/configs/paper_eval.yaml's, as recipes/evaluate.py reads them."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--temperature"]
    if values:
        return float(values[-1])
    configs = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--config"]
    preset = shipped_path(configs[-1]) if configs else str(ROOT / "recipes" / "configs" / "paper_eval.yaml")
    default = EvalSettings.__dataclass_fields__["temperature"].default
    return float(read_preset(preset).get("temperature", default))


def attributed(cell: Cell) -> bool:
    return cell.workflow != SA_RL and cell.policy_sharing == "isolated"


def attribution_report(root: Path, cells: list[Cell], args: GridArguments) -> str:
    """Every attribution found in the cells' run folders, as one markdown table per workflow (and its plot)."""
    from trl_multiagent.evaluation.attribution import format_attribution

    results = [
        (cell, json.loads(path.read_text()))
        for cell in cells
        if attributed(cell)
        for path in sorted(cell.run_dir.glob("attribution-*.json"))
    ]
    if not results:
        return ""
    try:
        from trl_multiagent.evaluation.plots import plot_attribution

        for key in dict.fromkeys(group_key(cell) for cell, _ in results):
            group = [(cell, result) for cell, result in results if group_key(cell) == key]
            title = " ".join(map(str, key if args.seeds else key[:2]))
            path = root / "plots" / f"attribution-{plot_name(group[0][0], args)}.png"
            plot_attribution([result for _, result in group], path, title)
    except ImportError as e:
        print(f"No attribution plot: {e}")
    return "\n".join(format_attribution(result) for _, result in results)


def recipe_path(cell: Cell) -> Path:
    return ROOT / "recipes" / f"{cell.workflow}_{cell.task}.py"


def ready(command: list[str]) -> bool:
    """Whether the runs an evaluation reads exist (a failed training leaves none)."""
    return all(Path(command[i + 1]).is_dir() for i, arg in enumerate(command) if arg in READS)


def resolve(command: list[str]) -> list[str]:
    """A printed command as it runs: `python` and `accelerate` of this environment, scripts found under the
    repository, and shipped configs (recipes/configs/, accelerate_configs/) found there when not here."""
    executable = {"python": sys.executable, "accelerate": str(Path(sys.executable).parent / "accelerate")}
    resolved = [executable.get(arg, arg) if i == 0 else arg for i, arg in enumerate(command)]
    resolved = [str(ROOT / arg) if arg.startswith("recipes/") and arg.endswith(".py") else arg for arg in resolved]
    return [shipped_path(arg) for arg in resolved]


def shipped_path(value: str) -> str:
    """``recipes/...`` or ``accelerate_configs/...`` as given when it exists here, else the repository's (or the
    installed package's) file; any other value unchanged."""
    if value.startswith(("recipes/", "accelerate_configs/")) and not Path(value).exists():
        if (ROOT / value).exists():
            return str(ROOT / value)
    return value


def run(command: list[str]) -> bool:
    """Run a printed command here."""
    print(f"\n$ {shlex.join(command)}", flush=True)
    return subprocess.run(resolve(command)).returncode == 0


def cell_training(args: GridArguments, cell: Cell, command: list[str]):
    """The submitit job of one training: `accelerate launch --config_file X` (this Python's accelerate) and the
    recipe with its flags; the node topology is filled in on each node from SLURM's environment."""
    from trl_multiagent.cli.slurm import CellTraining

    config = command.index("--config_file") + 1
    config_file = Path(command[config]) if Path(command[config]).is_file() else ROOT / command[config]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file.resolve())]
    processes = args.gpus_per_run * args.nodes_per_run
    if processes > 1 and (yaml.safe_load(config_file.read_text()) or {}).get("distributed_type") == "NO":
        raise ValueError(
            f"{args.accelerate_config} starts one process but a run gets {processes} GPUs: pass a distributed "
            "--accelerate_config (accelerate_configs/multi_gpu.yaml, multi_node.yaml, deepspeed_zero2.yaml)."
        )
    return CellTraining(
        launcher=launcher,
        script=resolve(command[config + 1 :]),
        run_dir=str(cell.run_dir),
        nodes=args.nodes_per_run,
        processes_per_node=max(args.gpus_per_run, 1),
        port=args.main_process_port,
    )


def executor(args: GridArguments, folder: Path, name: str, nodes: int, gpus: int, **parameters):
    """A submitit executor of ``--slurm_executor``'s kind for jobs of ``nodes`` nodes, one task and ``gpus`` GPUs
    each; its job scripts and logs go to ``folder/<job id>``."""
    from trl_multiagent.cli.slurm import require_submitit

    extra = json.loads(args.slurm_parameters)
    made = require_submitit().AutoExecutor(folder=folder / "%j", cluster=args.slurm_executor)
    made.update_parameters(
        name=name,
        nodes=nodes,
        tasks_per_node=1,
        gpus_per_node=gpus,
        timeout_min=args.slurm_timeout_min,
        slurm_partition=args.partition,
        **({"slurm_additional_parameters": extra} if extra else {}),
        **parameters,
    )
    return made


def submit(args: GridArguments, trainings: list[tuple[Cell, list[str]]], evaluations: list[list[str]]) -> list[str]:
    """Submit the grid through submitit; the failed commands once the jobs ran (local/debug executors), else []."""
    from trl_multiagent.cli.slurm import FINISHED, GridEvaluation, evaluation_marker

    folder = Path(args.slurm_folder or Path(args.output_root) / "slurm")
    train_executor = executor(args, folder, name="grid-train", nodes=args.nodes_per_run, gpus=args.gpus_per_run)
    pending = [(cell, command) for cell, command in trainings if not (cell.run_dir / FINISHED).is_file()]
    jobs = {}
    with train_executor.batch():  # one job array
        for cell, command in pending:
            jobs[str(cell.run_dir)] = train_executor.submit(cell_training(args, cell, command))
    for cell, _ in trainings:
        print(
            f"training {cell.run_dir}: "
            + (f"job {jobs[str(cell.run_dir)].job_id}" if str(cell.run_dir) in jobs else "finished before"),
            flush=True,
        )
    waiting = args.slurm_executor != "slurm"  # local and debug executors know no dependencies: wait here
    failed, broken = [], set()
    if waiting:
        for run_dir, job in jobs.items():
            try:
                job.result()
            except Exception as error:  # the job's own error, with its log's path
                failed.append(f"training {run_dir}: {error}")
                broken.add(run_dir)
    eval_jobs, evaluating = [], {}  # run folder -> the jobs evaluating it in its own workflow
    for command in evaluations:
        marker = evaluation_marker(folder, command)
        reads = [command[i + 1] for i, arg in enumerate(command) if arg in READS]
        if marker.is_file():
            print(f"skip evaluation (finished): {shlex.join(command)}")
            continue
        if broken.intersection(reads):
            failed.append(f"not evaluated (its training failed): {shlex.join(command)}")
            continue
        after = [jobs[d].job_id for d in reads if d in jobs and not waiting]
        if "--best_of_calls" in command:  # n is read from the matched run's evaluations: after them
            matched = evaluating.get(command[command.index("--best_of_calls") + 1], [])
            if waiting:
                for job in matched:
                    with contextlib.suppress(Exception):  # a failure is reported below, with the others
                        job.result()
            after += [job.job_id for job in matched if not waiting]
        dependency = {"slurm_dependency": "afterok:" + ":".join(after)} if after else {}
        evaluator = executor(args, folder, name="grid-eval", nodes=1, gpus=min(args.gpus_per_run, 1), **dependency)
        job = evaluator.submit(GridEvaluation(resolve(command), str(marker)))
        print(
            f"evaluation job {job.job_id}"
            + (f" after {', '.join(after)}" if after else "")
            + f": {shlex.join(command)}"
        )
        eval_jobs.append((command, job))
        if not {"--mode", "--attribution", "--best_of_calls"}.intersection(command):
            evaluating.setdefault(command[command.index("--run_dir") + 1], []).append(job)
    if waiting:
        for command, job in eval_jobs:
            try:
                job.result()
            except Exception as error:
                failed.append(f"{shlex.join(command)}: {error}")
    else:
        print(
            f"\nSubmitted; logs under {folder}. Once the jobs finished, the same command with --report_only writes "
            "the table; the same command again resubmits what did not finish."
        )
    return failed


def report(args: GridArguments, cells: list[Cell]) -> None:
    """Tables, per-role instability and plots of every run, written to <output_root>/."""
    root = Path(args.output_root)
    rows = {cell.run_dir: read_results(cell.run_dir) for cell in cells}
    root.mkdir(parents=True, exist_ok=True)
    tables, text = {}, ""
    for seed in args.seeds or [None]:  # one curve per cell and seed: without --seeds, one table as before seeds
        seed_rows = [row for cell in cells if seed in (None, cell.seed) for row in rows[cell.run_dir]]
        tables[seed] = paper_table(seed_rows)
        text += (f"## seed {seed}\n\n" if seed is not None else "") + format_table(tables[seed])
    table = tables[None] if not args.seeds else {str(seed): table for seed, table in tables.items()}
    families = {}
    for model, family in dict.fromkeys((cell.model, cell.family) for cell in cells):
        group = [row for cell in cells if (cell.model, cell.family) == (model, family) for row in rows[cell.run_dir]]
        title = f"{family.name} ({family.task} task, {family.dataset or 'its own dataset'}) on {model}"
        families[title] = family_table(group)
    family_text = "\n".join(format_family_table(title, result) for title, result in families.items())
    instability = {str(cell.run_dir): role_instability(read_log_history(cell.run_dir)) for cell in cells}
    (root / "table.md").write_text(text)
    (root / "table.json").write_text(json.dumps(table, indent=1))
    (root / "families.md").write_text(family_text)
    (root / "families.json").write_text(json.dumps(families, indent=1))
    (root / "instability.json").write_text(json.dumps(instability, indent=1))
    print("\n" + text)
    print(instability_table(instability))
    attribution = attribution_report(root, cells, args)
    if attribution:
        (root / "attribution.md").write_text(attribution)
        print(attribution)
    print(family_text)
    try:
        plot(root / "plots", rows, cells, args)
    except ImportError as e:
        print(f"No plots: {e}")
    print(f"Wrote {root}/table.md, table.json, families.md, families.json, instability.json and plots/")


def plot_name(cell: Cell, args: GridArguments) -> str:
    """``<model>-<family>`` (and ``-seed<N>`` with --seeds) in the names of a cell's plots."""
    return f"{Path(cell.model).name}-{cell.family.name}" + (f"-seed{cell.seed}" if args.seeds else "")


def instability_table(instability: dict[str, dict[str, dict[str, float]]]) -> str:
    columns = ("policy_ratio_max", "policy_ratio_max_step", "chi_square_max", "grad_norm_max", "entropy_collapse")
    lines = ["| run | role | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 2)]
    for run_dir, roles in instability.items():
        for role, summary in roles.items():
            values = [f"{summary[c]:.4g}" if c in summary else "-" for c in columns]
            lines.append(f"| {run_dir} | {role} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def plot(folder: Path, rows: dict[Path, list[dict]], cells: list[Cell], args: GridArguments) -> None:
    """Accuracy vs step per model, family and seed (every cell and control); per run, per-role training curves."""
    from trl_multiagent.evaluation.plots import plot_accuracy, plot_role_metric

    for key in dict.fromkeys(group_key(cell) for cell in cells):
        group_cells = [cell for cell in cells if group_key(cell) == key]
        group = [row for cell in group_cells for row in rows[cell.run_dir]]
        if group:
            name, (model, family, seed) = plot_name(group_cells[0], args), key
            title = f"{model} {family}" + (f" seed {seed}" if args.seeds else "")
            plot_accuracy(group, folder / f"accuracy-{name}.png", title=title)
    for cell in cells:
        history = read_log_history(cell.run_dir)
        for metric in ("completion_length", "perplexity", "entropy", "policy_ratio"):
            name = f"{plot_name(cell, args)}-{cell.run_dir.name}-{metric}.png"
            title = f"{cell.run_dir.name} ({cell.model}, {cell.family.name}" + (
                f", seed {cell.seed})" if args.seeds else ")"
            )
            plot_role_metric(history, metric, folder / name, title=title)


def main(args: GridArguments) -> int:
    cells = grid_cells(args)
    trainings = [(cell, train_command(args, cell)) for cell in cells]
    evaluations = eval_commands(args, cells)
    if args.dry_run:
        for _, command in trainings:
            print(shlex.join(command))
        for command in evaluations:
            print(shlex.join(command))
        return 0
    failed = []
    if args.launcher == "slurm" and not args.report_only:
        failed = submit(args, trainings, evaluations)
        if args.slurm_executor == "slurm":
            return 0
    elif not args.report_only:
        missing = sorted({str(recipe_path(cell)) for cell in cells if not recipe_path(cell).is_file()})
        if missing:
            raise FileNotFoundError(f"No recipe {missing}; drop those workflows or tasks from the grid.")
        progress = tqdm(total=len(trainings) + len(evaluations), desc="grid: trainings + evaluations", unit="run")
        for cell, command in trainings:
            if (cell.run_dir / "multiagent_config.json").is_file():
                tqdm.write(f"skip training {cell.run_dir}: finished")
            elif not run(command):
                failed.append(shlex.join(command))
            progress.update()
        for command in evaluations:
            if ready(command) and not run(command):
                failed.append(shlex.join(command))
            progress.update()
        progress.close()
    report(args, cells)
    for command in failed:
        print(f"FAILED: {command}", file=sys.stderr)
    return 1 if failed else 0


def parse_args(argv: list[str]) -> GridArguments:
    """The grid's flags; ``--preset NAME`` first sets its values as defaults, so that any flag given (or set by
    --config) wins over the preset's."""
    parser = TrlParser((GridArguments,))
    presets = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--preset"]
    presets += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--preset=")]
    for name in presets[-1:]:
        if name not in PRESETS:
            raise ValueError(f"--preset {name!r}: the presets are {', '.join(PRESETS)}.")
        parser.set_defaults(**PRESETS[name])
    (args,) = parser.parse_args_and_config(argv)
    if args.preset is not None and args.preset not in presets:
        raise ValueError("Give --preset on the command line (a --config file cannot set it).")
    return args


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(parse_args(sys.argv[1:])))
