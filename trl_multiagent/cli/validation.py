"""``--validate``: whether a training command would start, answered on any machine without loading anything.

A training recipe (or ``trl-multiagent train``) given ``--validate`` parses its settings as for training (presets,
the command line, the config's own checks), builds its workflow, and makes every check the trainer makes of them when
it is built, with the same functions (``run_checks.check_run``), under the launch the command asks for: a DeepSpeed
engine or not, the number of processes and machines, the mixed precision. It then prints what would run and exits 0,
or prints the refusal and exits 1. It loads no weights or tokenizer, downloads no dataset, and touches no GPU or vLLM
server: a GPU run's ``bf16`` is accepted as a bf16 GPU would accept it, a Hub dataset's first row is stood in for by
the task's offline rows (the same columns), and what needs the model or a device is checked as training starts.

The launch is read from the environment the launcher gave the process. ``one_process_launch`` runs a recipe the way
``accelerate launch`` would, as one process: accelerate's own parsing of the launch flags and config file gives each
process's environment (``seams.accelerate.planned_launch``), and ``LAUNCH_VARIABLE`` carries the planned number of
processes and machines, which the parsed settings then count with (``planned_world``) without any process group.
Under the launcher itself (``accelerate launch``, ``torchrun``, ``deepspeed``: ``WORLD_SIZE`` in each process's
environment) each process checks the launch alone, as one standing for it (``stand_for_the_launch``): a process group
would wait for every process, and TrainingArguments without a GPU count one process, not the launch's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ..seams.accelerate import planned_launch

# The flags that make a recipe read its settings and exit, training nothing: check them as the trainer would, or
# print them with where each came from (recipe_parser.py). Neither needs a device or the launcher's processes.
VALIDATE = "--validate"
PRINT_CONFIG = "--print_config"
PRINT_CONFIG_ALIAS = "--print-config"  # the first spelling, still read
SETTINGS_ONLY = (VALIDATE, PRINT_CONFIG, PRINT_CONFIG_ALIAS)
LAUNCH_VARIABLE = "TRL_MULTIAGENT_LAUNCH"  # JSON: the launch a validation stands for (processes, machines, launcher)
LAUNCHER_NAMES = {  # accelerate's launchers (seams/accelerate.py)
    "simple_launcher": "accelerate launch (one process)",
    "multi_gpu_launcher": "accelerate launch (torchrun)",
    "deepspeed_launcher": "accelerate launch (DeepSpeed)",
}
STAND_IN_ROWS = 4  # rows a dataset check draws from an offline generator


# What makes accelerate (and DeepSpeed) join this process to a process group of the launch's processes.
PROCESS_GROUP_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class PlannedLaunch:
    """The launch a validation stands for: a planned one, or (``started``) the one that started this process."""

    processes: int  # over every machine
    machines: int
    launcher: str  # what would start the processes: "accelerate launch (DeepSpeed)", "torchrun", ...
    started: bool = False  # the launcher started this process and every other: each checks the launch alone

    def environment(self) -> dict[str, str]:
        """The variable that makes a validation in this process stand for this launch."""
        planned = {"processes": self.processes, "machines": self.machines, "launcher": self.launcher}
        return {LAUNCH_VARIABLE: json.dumps({**planned, "started": self.started})}


def one_process_launch(
    script: str | Path, script_args: Sequence[str], launch_args: Sequence[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command, and the environment variables to add, that run ``script script_args`` in one process as
    ``accelerate launch launch_args script script_args`` would start each of its processes (without ``launch_args``:
    as one plain process). For the ``SETTINGS_ONLY`` flags, which read the settings and exit."""
    if launch_args is None:
        return [sys.executable, str(script), *script_args], {}
    return accelerate_launch_in_one_process([*launch_args, str(script), *script_args])


def accelerate_launch_in_one_process(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``accelerate launch ARGV`` as one process: the script's command, with the environment accelerate would give
    each process it starts and the processes and machines it would start (``LAUNCH_VARIABLE``)."""
    launcher, launch, env = planned_launch(argv)
    command = [sys.executable, launch.training_script, *launch.training_script_args]
    planned = PlannedLaunch(launch.num_processes, launch.num_machines, LAUNCHER_NAMES[launcher])
    return command, {**env, **planned.environment()}


def planned_launch_of_this_process() -> PlannedLaunch | None:
    """The launch ``LAUNCH_VARIABLE`` plans for this validation, if any."""
    value = os.environ.get(LAUNCH_VARIABLE)
    if not value:
        return None
    planned = json.loads(value)
    processes, machines, launcher = int(planned["processes"]), int(planned["machines"]), str(planned["launcher"])
    return PlannedLaunch(processes, machines, launcher, started=bool(planned.get("started", False)))


def stand_for_the_launch() -> None:
    """In a process that a launcher started with others (``WORLD_SIZE`` in its environment), for a run that reads its
    settings and exits (the ``SETTINGS_ONLY`` flags): from now on this process stands for the launch as
    ``one_process_launch`` plans it (``LAUNCH_VARIABLE``: the launcher's processes and machines), and joins no process
    group (``PROCESS_GROUP_VARIABLES`` removed: the others check the launch alone too, and nothing trains). ``RANK``
    stays, so that the first process alone prints."""
    if "WORLD_SIZE" not in os.environ:
        return
    if not os.environ.get(LAUNCH_VARIABLE):
        processes = int(os.environ["WORLD_SIZE"])
        per_machine = int(os.environ.get("LOCAL_WORLD_SIZE") or processes)
        planned = PlannedLaunch(processes, max(processes // per_machine, 1), _launcher_of_this_process(), started=True)
        os.environ.update(planned.environment())
    for name in PROCESS_GROUP_VARIABLES:
        os.environ.pop(name, None)


def _launcher_of_this_process() -> str:
    """What started this process, as its environment says: accelerate sets its own variables in every process."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return LAUNCHER_NAMES["deepspeed_launcher"]
    if any(name.startswith("ACCELERATE_") for name in os.environ):
        return LAUNCHER_NAMES["multi_gpu_launcher"]
    return "torchrun"


def planned_world(config_class: type, processes: int) -> type:
    """``config_class`` (a ``TrainingArguments``) whose ``world_size`` is ``processes``: the settings of one process
    of a launch of that many, checked without starting them. TrainingArguments, TRL's and our config's checks split
    the batch over ``world_size``; it stays the only difference."""

    def world_size(self) -> int:
        return processes

    return type(config_class.__name__, (config_class,), {"world_size": property(world_size)})


@dataclass(frozen=True)
class RowsForChecks:
    """The rows the dataset checks read, and what they are."""

    rows: Any
    what: str


def rows_for_checks(task, name: str | None, *, split: str = "train", seed: int = 0) -> RowsForChecks:
    """A few rows of the dataset ``name`` as training would read it (``task``'s offline generators, a local file),
    or, for a Hub dataset, a few of ``task``'s offline rows (the same columns), named as such: nothing is downloaded.
    """
    from ..tasks import TASKS

    for candidate in (task, *TASKS.values()):
        generate = candidate.generator(name)
        if generate is not None:
            return RowsForChecks(generate(n=STAND_IN_ROWS, seed=seed), f"{name} (offline generator)")
    if name is not None and os.path.isfile(name):
        return RowsForChecks(task.train_dataset(name, split, seed), f"{name} (local file)")
    stand_in = task.generated
    rows = task.generator(stand_in)(n=STAND_IN_ROWS, seed=seed)
    return RowsForChecks(
        rows,
        f"{name or task.dataset_id} (the Hub: not downloaded; the workflow walked a row of {stand_in}, which has the "
        "same columns)",
    )


def validate_run(
    args,
    workflow,
    *,
    model: str,
    peft_config: Any,
    dataset: RowsForChecks,
    settings: str = "",
) -> NoReturn:
    """Make every check the trainer makes of these settings (``check_run``), print what would run (on the first
    process) and exit 0; on a refusal print it and exit 1. ``model``: the name or folder given (not loaded);
    ``settings``: the layers that made the settings (``RecipeParser.settings``)."""
    from ..common.model_names import resolve_model_name
    from ..config.run_checks import check_run

    try:
        checked = check_run(
            args, workflow, model=resolve_model_name(model), peft_config=peft_config, train_dataset=dataset.rows
        )
    except (ValueError, TypeError, FileNotFoundError) as error:
        refuse(f"the trainer would refuse these settings when it is built: {error}")
    if os.environ.get("RANK", "0") == "0":
        print(summary(checked, workflow, model=model, peft_config=peft_config, dataset=dataset, settings=settings))
    sys.exit(0)


def refuse(reason: str) -> NoReturn:
    print(f"validate: {reason}", file=sys.stderr, flush=True)
    sys.exit(1)


def summary(checked, workflow, *, model: str, peft_config: Any, dataset: RowsForChecks, settings: str) -> str:
    """What would run, one line a part."""
    from ..common.model_names import resolve_model_name

    args = checked.args
    folder = resolve_model_name(model)
    where = "a folder here" if os.path.isdir(folder) else "not here: read from the Hub when training starts"
    lora = "none (a ready PeftModel)"
    if peft_config is not None:
        lora = f"r={peft_config.r}, alpha={peft_config.lora_alpha}, dropout {peft_config.lora_dropout}, on "
        lora += f"{peft_config.target_modules}"
    per_process = args.per_device_train_batch_size * args.gradient_accumulation_steps
    step = f"{per_process * checked.launch.num_processes} episodes ({args.num_generations} per prompt)"
    step += f" over {checked.launch.num_processes} process(es); update schedule {args.update_schedule}"
    if args.max_tokens_per_micro_batch is not None:
        step += f", micro-batches of at most {args.max_tokens_per_micro_batch} tokens"
    lines = [
        "validate: every check the trainer makes of these settings passed; nothing was loaded or trained.",
        f"  settings  {settings.removeprefix('settings: ')}" if settings else None,
        f"  launch    {launch_line(args, checked.launch)}",
        f"  model     {model} ({where}; weights not loaded)",
        f"  LoRA      {lora}",
        f"  workflow  {type(workflow).__name__}({_arguments(workflow)}); adapters {checked.role_adapters}",
        f"  dataset   {dataset.what}",
        f"  step      {step}",
        f"  rollouts  {args.rollout_backend} backend, {args.rollout_mode}"
        + ("; the next batch's during this step" if checked.rollout_ahead else ""),
        f"  run       {args.max_steps} steps, checkpoints every {args.save_steps} in {args.output_dir}",
        "  left for training's start: the model's own checks (its weights, tokenizer and architecture; a k-bit "
        "quantization's GPU and bitsandbytes), TRL's checks of the loaded model, the rollout backend's construction "
        "(a vLLM engine or server)",
    ]
    return "\n".join(line for line in lines if line is not None)


def launch_line(args, launch) -> str:
    """``DeepSpeed ZeRO-3, 8 processes on 1 machine(s), mixed precision bf16, GPU``: the launch as this process sees
    it (its environment, or the one ``LAUNCH_VARIABLE`` plans)."""
    planned = planned_launch_of_this_process()
    machines = planned.machines if planned else _machines_of_this_launch()
    if launch.deepspeed:
        engine = f"DeepSpeed ZeRO-{args.deepspeed_plugin.zero_stage}"
    elif os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        engine = "FSDP"
    else:
        engine = "DDP" if launch.num_processes > 1 else "no distributed engine"
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION") or (
        "bf16" if args.bf16 else "fp16" if args.fp16 else "no"
    )
    device = "CPU" if args.use_cpu else "GPU (not checked here)"
    started = ""
    if planned is not None and planned.started:
        started = f"; as {planned.launcher} started it, each process checked alone"
    elif planned is not None:
        started = f"; as {planned.launcher} would start it, checked in one process"
    return (
        f"{engine}, {launch.num_processes} process(es) on {machines} machine(s), mixed precision {precision}, "
        f"{device}{started}"
    )


def _machines_of_this_launch() -> int:
    """Machines of a launch this process is part of: torchrun's processes over its processes per machine."""
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    return max(world // local, 1) if local else 1


def _arguments(workflow) -> str:
    config = workflow.config_dict()
    return ", ".join(f"{key}={value!r}" for key, value in config.items() if key != "workflow")
