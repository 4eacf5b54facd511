"""Every command README.md and docs/ show gets through argument parsing, preset layering and every construction-time
check of its settings under its launch, on CPU, offline, without a GPU, the Hub or a vLLM server.

The commands are read from the Markdown (tests/documented_commands.py says which spans count). Each kind is checked
as far as it can run without weights, a device or a server:

- a training command (``accelerate launch ... recipes/<train>.py``, ``torchrun ...``, ``python recipes/<train>.py``,
  ``trl-multiagent train``) with ``--validate``: the recipe parses its settings, builds its workflow and makes every
  check the trainer makes when it is built (``run_checks.check_run``), under its launch: accelerate's own reading of
  the launch flags and config file gives the process's environment (DeepSpeed and its stage, mixed precision) and the
  number of processes and machines the settings count with; a GPU run's bf16 is accepted as a GPU would accept it, a
  Hub dataset is stood in for by the task's offline rows. A command that needs a GPU or a vLLM server to run is
  checked up to there: loading the model and building the rollout backend are all that is left out;
- an evaluation (``python recipes/evaluate.py``, ``trl-multiagent eval``) with ``--print_config``: its flags and
  presets; the run folder it reads is made by a training command;
- a grid (``python recipes/grid.py``, ``trl-multiagent grid``) with ``--dry-run``: it plans and prints every training
  and evaluation command, and each of those is checked as above (one of each settings combination: the output
  folders and seeds enter no check);
- ``trl-multiagent vllm-serve`` with ``--dry-run``: it prints the server command without starting vLLM;
- ``trl-multiagent report``, the benchmarks, ``scripts/`` and ``python -m trl_multiagent...``: their argument parser
  reads the flags as written, then the script stops (what they do takes minutes or a trained run; the benchmarks run
  at their smallest in tests/benchmarks/test_smallest_settings.py).

A command documented as refused (``# refused: WORDS`` on its line) must be refused with WORDS in the message.
The commands run in a folder that holds this checkout's files, beside the files the pages tell a user to write (a
YAML block whose first line names its file, ``# my_toy.yaml: ...``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from documented_commands import ROOT, DocCommand, Job, Outcome, documented_commands
from harness import offline_env

from trl_multiagent.cli.commands import train_run
from trl_multiagent.cli.validation import (
    LAUNCH_VARIABLE,
    PRINT_CONFIG,
    VALIDATE,
    PlannedLaunch,
    accelerate_launch_in_one_process,
)

COMMANDS = documented_commands()
RUNNABLE = [command for command in COMMANDS if command.placeholder is None]
PATTERNS = [command for command in COMMANDS if command.placeholder is not None]
EVALUATE, GRID = "recipes/evaluate.py", "recipes/grid.py"
TRAINING_RECIPES = {
    f"recipes/{path.name}" for path in (ROOT / "recipes").glob("*.py") if path.stem.endswith(("_math", "_code"))
} | {"recipes/train.py"}
# Flags whose values (output folders, seeds) enter no check: a grid's commands that differ only there are one check.
UNCHECKED_VALUES = ("--output_dir", "--run_dir", "--seed")


def jobs_for(argv: list[str]) -> list[Job]:
    """The worker jobs that check one command (a grid's are its dry run; its commands come after)."""
    program, args = argv[0], argv[1:]
    if program == "accelerate":
        command, env = accelerate_launch_in_one_process([*args[1:], VALIDATE])
        return [Job(command[1:], env)]
    if program == "torchrun":
        from torch.distributed.run import get_args_parser

        launch = get_args_parser().parse_args(args)
        machines = int(str(launch.nnodes).split(":")[-1])
        planned = PlannedLaunch(int(launch.nproc_per_node) * machines, machines, "torchrun")
        return [Job([launch.training_script, *launch.training_script_args, VALIDATE], planned.environment())]
    if program == "trl-multiagent":
        return cli_jobs(args[0], args[1:])
    if args[0] == "-m":
        return [Job(args, parse_only=True)]
    script, rest = args[0], args[1:]
    if script in TRAINING_RECIPES:
        return [Job([script, *rest, VALIDATE])]
    if script == EVALUATE:
        return [Job([script, *rest, PRINT_CONFIG])]
    if script == GRID:
        return [Job([script, *rest, *([] if "--dry-run" in rest else ["--dry-run"])])]
    return [Job([script, *rest], parse_only=True)]


def cli_jobs(command: str, args: list[str]) -> list[Job]:
    if command == "train":
        run, env = train_run([*args, VALIDATE])
        return [Job(run[1:], env)]
    if command == "eval":
        return jobs_for(["python", EVALUATE, *args])
    if command == "grid":
        return jobs_for(["python", GRID, *args])
    dry_run = ["--dry-run"] if command == "vllm-serve" and "--dry-run" not in args else []
    return [Job(["-m", "trl_multiagent.cli", command, *args, *dry_run], parse_only=command == "report")]


def planned_commands(grid_output: str) -> list[list[str]]:
    """The training and evaluation commands a grid's dry run printed, one per settings combination."""
    seen, planned = set(), []
    for line in grid_output.splitlines():
        if not line.startswith(("accelerate launch ", "python recipes/")):
            continue
        argv = shlex.split(line)
        key = [w for i, w in enumerate(argv) if w not in UNCHECKED_VALUES and argv[i - 1] not in UNCHECKED_VALUES]
        if tuple(key) not in seen:
            seen.add(tuple(key))
            planned.append(argv)
    return planned


def user_folder(tmp: Path) -> Path:
    """A folder holding this checkout's files, and the files the pages tell a user to write."""
    tmp.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (tmp / entry.name).symlink_to(entry)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
            named = re.match(r"#\s*([\w.-]+\.yaml)\b", block)
            if named:
                (tmp / named.group(1)).write_text(block)
    return tmp


def run_worker(jobs: list[Job], folder: Path) -> list[Outcome]:
    """Run ``jobs`` in one worker process (tests/documented_commands.py) in ``folder``."""
    results = folder.parent / f"results-{len(list(folder.parent.glob('results-*')))}.json"
    # DeepSpeed builds its CPU communication op once per extensions folder (about a minute): the one pytest keeps.
    env = offline_env({"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(ROOT / ".pytest_cache" / "extensions")})
    worker = Path(__file__).resolve().parents[1] / "documented_commands.py"
    payload = json.dumps([job.__dict__ for job in jobs])
    done = subprocess.run(
        [sys.executable, str(worker), str(results), str(folder)],
        input=payload,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"the worker failed:\n{done.stderr[-5000:]}"
    return [Outcome(**outcome) for outcome in json.loads(results.read_text())]


@cache
def checked() -> dict[str, list[tuple[str, Outcome]]]:
    """Every runnable command's checks: (what ran, its outcome), by ``where`` and text."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="documented-commands-"))
    folder = user_folder(base / "checkout")
    with contextlib.chdir(folder):  # the launch flags name files as a user in the checkout names them
        return _checked(folder)


def _checked(folder: Path) -> dict[str, list[tuple[str, Outcome]]]:
    first = {command: jobs_for(list(command.argv)) for command in RUNNABLE}
    unique = {job.key(): job for jobs in first.values() for job in jobs}
    # DeepSpeed's communication, once started in the worker, stays: those jobs go last.
    ordered = sorted(unique.values(), key=lambda job: job.env.get("ACCELERATE_USE_DEEPSPEED") == "true")
    outcomes = dict(zip([job.key() for job in ordered], run_worker(ordered, folder)))
    second: dict[str, list[list[str]]] = {}
    for jobs in first.values():
        for job in jobs:
            if job.argv[0] == GRID and outcomes[job.key()].code == 0:
                second[job.key()] = planned_commands(outcomes[job.key()].out)
    more = {sub.key(): sub for argvs in second.values() for argv in argvs for sub in jobs_for(argv)}
    more = {key: job for key, job in more.items() if key not in outcomes}
    ordered = sorted(more.values(), key=lambda job: job.env.get("ACCELERATE_USE_DEEPSPEED") == "true")
    outcomes.update(zip([job.key() for job in ordered], run_worker(ordered, folder)))
    report: dict[str, list[tuple[str, Outcome]]] = {}
    for command, jobs in first.items():
        ran = [(described(job), outcomes[job.key()]) for job in jobs]
        for job in jobs:
            for argv in second.get(job.key(), []):
                ran += [(f"{shlex.join(argv)}, as {described(sub)}", outcomes[sub.key()]) for sub in jobs_for(argv)]
        report[command.where + " " + command.text] = ran
    return report


def described(job: Job) -> str:
    launch = f" (standing for {job.env[LAUNCH_VARIABLE]})" if LAUNCH_VARIABLE in job.env else ""
    return f"python {shlex.join(job.argv)}{launch}"


@pytest.mark.slow
@pytest.mark.parametrize("command", RUNNABLE, ids=[f"{c.where} {' '.join(c.argv[:4])}" for c in RUNNABLE])
def test_documented_command_gets_through_every_check(command: DocCommand):
    for ran, outcome in checked()[command.where + " " + command.text]:
        said = f"`{command.text}` ({command.where}), checked as `{ran}`:\n{outcome.err[-3000:]}\n{outcome.out[-1500:]}"
        if command.refused is None:
            assert outcome.code == 0, f"refused or failed, exit {outcome.code}: {said}"
        else:
            assert outcome.code != 0, f"documented as refused ({command.refused}) but accepted: {said}"
            assert command.refused in outcome.err, f"refused, but not for {command.refused!r}: {said}"


def test_patterns_name_what_exists():
    """A pattern (``accelerate launch --config_file accelerate_configs/<setting>.yaml recipes/<recipe>.py``) is not
    run; its program is one a command of the docs runs, and the folders and files it names exist."""
    programs = {command.argv[0] for command in RUNNABLE}
    for pattern in PATTERNS:
        assert pattern.argv[0] in programs, pattern
        for word in pattern.argv:
            fixed = re.split(r"\.\.\.|<|\$|\[", word.split("=")[-1])[0]
            if fixed.startswith(("recipes/", "accelerate_configs/", "benchmarks/", "scripts/")):
                assert (ROOT / fixed).exists() or (ROOT / fixed).parent.is_dir(), f"{pattern.where}: {fixed}"


def test_a_page_is_read_for_the_commands_a_user_would_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Run `trl-multiagent train voting --config toy`; `trl-multiagent report` writes a page.\n"
        "```bash\n"
        "OMP_NUM_THREADS=1 accelerate launch --config_file accelerate_configs/cpu.yaml recipes/eval_opt_math.py \\\n"
        "    --config recipes/configs/toy.yaml   # the toy run\n"
        "for seed in 0 1; do\n"
        "  trl-multiagent train eval_opt --seed $seed && python recipes/grid.py --preset toy ...\n"
        "done\n"
        "pip install -e . && python scripts/build_tiny_model.py out\n"
        "trl-multiagent eval --run_dir RUN; trl-multiagent train voting --output_dir ...\n"
        "python -m trl_multiagent.evaluation.toy --policy x  # refused: no such policy\n"
        "```\n"
        "```python\n"
        "trl-multiagent train voting --config toy\n"
        "```\n"
    )
    read = [(c.where, " ".join(c.argv), c.placeholder, c.refused) for c in documented_commands([page])]
    assert read == [
        ("page.md:1", "trl-multiagent train voting --config toy", None, None),
        (
            "page.md:3",
            "accelerate launch --config_file accelerate_configs/cpu.yaml recipes/eval_opt_math.py --config "
            "recipes/configs/toy.yaml",
            None,
            None,
        ),
        ("page.md:6", "trl-multiagent train eval_opt --seed 0", None, None),
        ("page.md:6", "python recipes/grid.py --preset toy", None, None),
        ("page.md:8", "python scripts/build_tiny_model.py out", None, None),
        ("page.md:9", "trl-multiagent eval --run_dir RUN", "RUN", None),
        ("page.md:9", "trl-multiagent train voting --output_dir ...", "...", None),
        ("page.md:10", "python -m trl_multiagent.evaluation.toy --policy x", None, "no such policy"),
    ]
