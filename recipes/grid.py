"""Train and evaluate the paper's grid: workflow x policy sharing x model x task, plus base-model and SA-RL controls.

Every cell is one `accelerate launch recipes/<workflow>_<task>.py` with the same seed and budget; the SA-RL control
is `single_agent_<task>` per model and task. Then every checkpoint is evaluated (`recipes/evaluate.py`): each cell,
the base model in each workflow, the SA-RL run alone and in each workflow ("transfer"). Finally the table (peak
accuracy and its step, final accuracy, drop from peak, residual vs SA-RL in points), per-role instability summaries
and plots go to `<output_root>/`.

See the commands without running anything:

    python recipes/grid.py --dry-run

Paper grid (one GPU per run, sequentially; 3 workflows x 2 sharings x 3 models x 2 tasks + controls):

    python recipes/grid.py --output_root runs/grid --eval_args "--k 4 --temperature 0.7"

CPU, offline (the shipped toy model and presets; the arithmetic task alone takes about 40 minutes, output in README;
`--tasks math code` adds the toy_code cells, graded in the sandbox: README's 20-step code grid took 27 minutes more):

    python recipes/grid.py --models toy --tasks math code --accelerate_config accelerate_configs/cpu.yaml \
        --recipe_config math=recipes/configs/toy.yaml code=recipes/configs/toy_code.yaml \
        --eval_dataset math=arithmetic code=toy_code --max_steps 30 --save_steps 10 \
        --eval_args "--limit 100 --max_completion_length 80" --output_root outputs/grid-toy

On a SLURM cluster (`pip install 'trl-multiagent[slurm]'`): every training is an element of one job array, every
evaluation a job that starts once the trainings it reads succeeded; a preempted or timed-out training is requeued and
resumes from its newest complete checkpoint. Re-submitting skips finished trainings and finished evaluations:

    python recipes/grid.py --launcher slurm --partition gpu --gpus_per_run 8 \
        --accelerate_config accelerate_configs/multi_gpu.yaml --output_root runs/grid

`--attribution` adds, per isolated cell, which role's training brought the gain (`recipes/evaluate.py --attribution`:
each role's Shapley share with bootstrap intervals over problems; `<output_root>/attribution.md` and
`plots/attribution-<model>-<task>.png`).

Re-running skips finished trainings (a run's final `multiagent_config.json`) and evaluations already recorded;
`--report_only` only rebuilds the table and plots from what is there.
"""

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
from trl_multiagent.evaluation import format_table, paper_table, read_log_history, read_results, role_instability
from trl_multiagent.tasks import TASKS

ROOT = Path(__file__).resolve().parent.parent
SA_RL = "single_agent"


@dataclass
class GridArguments:
    workflows: list[str] = field(
        default_factory=lambda: ["eval_opt", "voting", "orch_workers"],
        metadata={"help": "Recipe workflow names (recipes/<workflow>_<task>.py)."},
    )
    policy_sharing: list[str] = field(default_factory=lambda: ["shared", "isolated"], metadata={"help": "Sharings."})
    models: list[str] = field(
        default_factory=lambda: ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"], metadata={"help": "Models."}
    )
    tasks: list[str] = field(
        default_factory=lambda: list(TASKS),
        metadata={"help": "Tasks (trl_multiagent.tasks.TASKS).", "choices": list(TASKS)},
    )
    output_root: str = field(default="runs/grid", metadata={"help": "Runs go to <root>/<model>/<task>/<cell>."})
    seed: int = field(default=42, metadata={"help": "Seed of every run and evaluation."})
    max_steps: int = field(default=500, metadata={"help": "Training steps of every run (the paper: 500)."})
    save_steps: int = field(default=5, metadata={"help": "Checkpoint (and evaluation) interval (the paper: 5)."})
    accelerate_config: str = field(default="accelerate_configs/single_gpu.yaml", metadata={"help": "Launch config."})
    recipe_config: list[str] = field(
        default_factory=list, metadata={"help": "task=path: the --config yaml of that task's recipes."}
    )
    recipe_args: str = field(default="", metadata={"help": "Extra flags for every training command."})
    eval_dataset: list[str] = field(
        default_factory=list, metadata={"help": "task=name: the evaluation dataset (default: the task's own)."}
    )
    eval_args: str = field(default="", metadata={"help": "Extra flags for every evaluation (e.g. '--k 4')."})
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


def per_task(entries: list[str], name: str) -> dict[str, str]:
    pairs = [entry.split("=", 1) for entry in entries]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"--{name} takes task=value entries, e.g. math=recipes/configs/cpu.yaml; got {entries}.")
    return dict(pairs)


def grid_cells(args: GridArguments) -> list[Cell]:
    """Per model and task: the SA-RL control first, then every workflow x policy sharing."""
    cells = []
    for model in args.models:
        for task in args.tasks:
            folder = Path(args.output_root) / Path(model.rstrip("/")).name / task
            cells.append(Cell(model, task, SA_RL, "isolated", folder / SA_RL))
            for workflow in args.workflows:
                for sharing in args.policy_sharing:
                    cells.append(Cell(model, task, workflow, sharing, folder / f"{workflow}-{sharing}"))
    return cells


def train_command(args: GridArguments, cell: Cell) -> list[str]:
    config = per_task(args.recipe_config, "recipe_config").get(cell.task)
    return [
        "accelerate", "launch", "--config_file", args.accelerate_config, f"recipes/{cell.workflow}_{cell.task}.py",
        *(["--config", config] if config else []),
        "--model_name_or_path", cell.model, "--output_dir", str(cell.run_dir), "--policy_sharing", cell.policy_sharing,
        "--seed", str(args.seed), "--max_steps", str(args.max_steps), "--save_steps", str(args.save_steps),
        *shlex.split(args.recipe_args),
    ]  # fmt: skip


def trained_renderings(args: GridArguments) -> dict[str, list[str]]:
    """task -> the flags that render evaluation prompts as its recipe config trains them (`chat_rendering` and
    `chat_template_kwargs`; the library defaults where the config leaves them out). Without a config the recipes
    and evaluate.py read the paper presets, which render alike."""
    library = MultiAgentGRPOConfig.__dataclass_fields__
    flags = {}
    for task, config in per_task(args.recipe_config, "recipe_config").items():
        preset = yaml.safe_load(Path(config).read_text()) or {}
        rendering = preset.get("chat_rendering", library["chat_rendering"].default)
        template_kwargs = preset.get("chat_template_kwargs", library["chat_template_kwargs"].default)
        flags[task] = ["--chat_rendering", rendering, "--chat_template_kwargs", json.dumps(template_kwargs)]
    return flags


def eval_commands(args: GridArguments, cells: list[Cell]) -> list[list[str]]:
    """Each cell's checkpoints; per model and task the base model in each workflow, SA-RL alone and transferred."""
    datasets = per_task(args.eval_dataset, "eval_dataset")
    renderings = trained_renderings(args)

    def command(cell: Cell, *extra: str) -> list[str]:
        dataset = ["--dataset_name", datasets[cell.task]] if cell.task in datasets else []
        rendering = renderings.get(cell.task, [])
        common = ["--task", cell.task, *dataset, *rendering, "--seed", str(args.seed), *shlex.split(args.eval_args)]
        return ["python", "recipes/evaluate.py", "--run_dir", str(cell.run_dir), *extra, *common]

    commands = [command(cell) for cell in cells]
    for sa_rl in (cell for cell in cells if cell.workflow == SA_RL):
        first_per_workflow: dict[str, Cell] = {}  # the workflow is the same under every policy sharing
        for cell in cells:
            if (cell.model, cell.task) == (sa_rl.model, sa_rl.task) and cell.workflow != SA_RL:
                first_per_workflow.setdefault(cell.workflow, cell)
        commands.append(command(sa_rl, "--mode", "base"))
        for cell in first_per_workflow.values():
            commands.append(command(cell, "--mode", "base"))
            commands.append(command(sa_rl, "--mode", "transfer", "--workflow", str(cell.run_dir)))
    if args.attribution:  # a shared policy is one adapter: nothing to split between roles
        commands += [command(cell, "--attribution") for cell in cells if attributed(cell)]
    return commands


def attributed(cell: Cell) -> bool:
    return cell.workflow != SA_RL and cell.policy_sharing == "isolated"


def attribution_report(root: Path, cells: list[Cell]) -> str:
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

        for model, task in dict.fromkeys((cell.model, cell.task) for cell, _ in results):
            group = [result for cell, result in results if (cell.model, cell.task) == (model, task)]
            plot_attribution(group, root / "plots" / f"attribution-{Path(model).name}-{task}.png", f"{model} {task}")
    except ImportError as e:
        print(f"No attribution plot: {e}")
    return "\n".join(format_attribution(result) for _, result in results)


def recipe_path(cell: Cell) -> Path:
    return ROOT / "recipes" / f"{cell.workflow}_{cell.task}.py"


def ready(command: list[str]) -> bool:
    """Whether the runs an evaluation reads exist (a failed training leaves none)."""
    return all(Path(command[i + 1]).is_dir() for i, arg in enumerate(command) if arg in ("--run_dir", "--workflow"))


def resolve(command: list[str]) -> list[str]:
    """A printed command as it runs: `python` and `accelerate` of this environment, scripts found under the
    repository."""
    executable = {"python": sys.executable, "accelerate": str(Path(sys.executable).parent / "accelerate")}
    resolved = [executable.get(arg, arg) if i == 0 else arg for i, arg in enumerate(command)]
    return [str(ROOT / arg) if arg.startswith("recipes/") and arg.endswith(".py") else arg for arg in resolved]


def run(command: list[str]) -> bool:
    """Run a printed command here."""
    print(f"\n$ {shlex.join(command)}", flush=True)
    return subprocess.run(resolve(command)).returncode == 0


def cell_training(args: GridArguments, cell: Cell, command: list[str]):
    """The submitit job of one training: `accelerate launch --config_file X` (this Python's accelerate) and the
    recipe with its flags; the node topology is filled in on each node from SLURM's environment."""
    from trl_multiagent.slurm import CellTraining

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
    from trl_multiagent.slurm import require_submitit

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
    from trl_multiagent.slurm import FINISHED, GridEvaluation, evaluation_marker

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
    eval_jobs = []
    for command in evaluations:
        marker = evaluation_marker(folder, command)
        reads = [command[i + 1] for i, arg in enumerate(command) if arg in ("--run_dir", "--workflow")]
        if marker.is_file():
            print(f"skip evaluation (finished): {shlex.join(command)}")
            continue
        if broken.intersection(reads):
            failed.append(f"not evaluated (its training failed): {shlex.join(command)}")
            continue
        after = [jobs[d].job_id for d in reads if d in jobs and not waiting]
        dependency = {"slurm_dependency": "afterok:" + ":".join(after)} if after else {}
        evaluator = executor(args, folder, name="grid-eval", nodes=1, gpus=min(args.gpus_per_run, 1), **dependency)
        job = evaluator.submit(GridEvaluation(resolve(command), str(marker)))
        print(
            f"evaluation job {job.job_id}"
            + (f" after {', '.join(after)}" if after else "")
            + f": {shlex.join(command)}"
        )
        eval_jobs.append((command, job))
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
    """Table, per-role instability and plots of every run, written to <output_root>/."""
    root = Path(args.output_root)
    rows = {cell.run_dir: read_results(cell.run_dir) for cell in cells}
    table = paper_table([row for cell_rows in rows.values() for row in cell_rows])
    instability = {str(cell.run_dir): role_instability(read_log_history(cell.run_dir)) for cell in cells}
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(format_table(table))
    (root / "table.json").write_text(json.dumps(table, indent=1))
    (root / "instability.json").write_text(json.dumps(instability, indent=1))
    print("\n" + format_table(table))
    print(instability_table(instability))
    attribution = attribution_report(root, cells)
    if attribution:
        (root / "attribution.md").write_text(attribution)
        print(attribution)
    try:
        plot(root / "plots", rows, cells)
    except ImportError as e:
        print(f"No plots: {e}")
    print(f"Wrote {root}/table.md, table.json, instability.json and plots/")


def instability_table(instability: dict[str, dict[str, dict[str, float]]]) -> str:
    columns = ("policy_ratio_max", "policy_ratio_max_step", "chi_square_max", "grad_norm_max", "entropy_collapse")
    lines = ["| run | role | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 2)]
    for run_dir, roles in instability.items():
        for role, summary in roles.items():
            values = [f"{summary[c]:.4g}" if c in summary else "-" for c in columns]
            lines.append(f"| {run_dir} | {role} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def plot(folder: Path, rows: dict[Path, list[dict]], cells: list[Cell]) -> None:
    """Accuracy vs step per model and task (every cell and control); per run, per-role training curves."""
    from trl_multiagent.evaluation.plots import plot_accuracy, plot_role_metric

    for model, task in dict.fromkeys((cell.model, cell.task) for cell in cells):
        group = [row for cell in cells if (cell.model, cell.task) == (model, task) for row in rows[cell.run_dir]]
        if group:
            plot_accuracy(group, folder / f"accuracy-{Path(model).name}-{task}.png", title=f"{model} {task}")
    for cell in cells:
        history = read_log_history(cell.run_dir)
        for metric in ("completion_length", "perplexity", "entropy", "policy_ratio"):
            name = f"{Path(cell.model).name}-{cell.task}-{cell.run_dir.name}-{metric}.png"
            plot_role_metric(history, metric, folder / name, title=f"{cell.run_dir.name} ({cell.model}, {cell.task})")


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


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    (grid_args,) = TrlParser((GridArguments,)).parse_args_and_config()
    sys.exit(main(grid_args))
