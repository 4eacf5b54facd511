"""Train any workflow class with any reward functions: what `trl-multiagent train --workflow ...` runs.

Your workflow (a `trl_multiagent.workflows.Workflow` subclass) and rewards (TRL's signature
`(completions, **columns) -> list[float]`) are imported by name, so their package must be importable:

    accelerate launch --config_file accelerate_configs/cpu.yaml recipes/train.py --config recipes/configs/toy.yaml \
        --workflow my_package.flows:DraftCritique --reward_funcs my_package.rewards.score --output_dir outputs/mine

`--dataset_name` takes `arithmetic` (the offline toy task), `toy_code`, the DAPO-Math or DeepCoder Hub id, a local
`.json`/`.jsonl` file, or any Hub dataset with a conversational `prompt` column (and the columns your rewards read).
Without `--reward_funcs` the task's reward is used (`--task math`: math_reward; `code`: CodeReward()).
Without `--config` the paper's math settings apply (recipes/configs/paper_math.yaml); another `--config` stands in
for them: one that names no `base:` starts from the library's defaults (docs/configuration.md), one with
`base: paper_math` (or `base: toy`, ...) from that preset. `--print_config` prints every setting with where it came
from and exits without training; `--validate` makes every check the trainer would make of these settings under this
launch, loads nothing, and exits (1 if refused).
TRL's model flags reach the model as in `trl grpo`: `--dtype`, `--attn_implementation`, `--model_revision`,
`--trust_remote_code`, and `--load_in_4bit` / `--load_in_8bit` for QLoRA (bitsandbytes, on a GPU).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from datasets import load_dataset
from trl import ScriptArguments

from trl_multiagent.cli import import_object
from trl_multiagent.cli.recipe_run import RecipeRun
from trl_multiagent.tasks import TASKS, get_task

# The paper's math settings; `--config other.yaml` stands in for this file (it starts from the library defaults unless
# it names a `base:`).
PAPER_PRESET = Path(__file__).parent / "configs" / "paper_math.yaml"


@dataclass
class WorkflowArguments:
    workflow: str = field(
        default="trl_multiagent.workflows:EvalOpt",
        metadata={"help": "The workflow class, as package.module:Class (your package must be importable)."},
    )
    workflow_kwargs: str = field(
        default="{}",
        metadata={
            "help": 'JSON keyword arguments, e.g. \'{"task": "code"}\'; they win over the options of the built-in '
            "workflows (prompts, parsing, history, workers, template), of which the class gets those it takes."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=list, metadata={"help": "Reward functions as package.module.function (default: the task's)."}
    )
    task: str = field(default="math", metadata={"help": "The default reward and datasets.", "choices": list(TASKS)})


def dataset_name(script_args: ScriptArguments) -> str:
    if script_args.dataset_name is None:
        raise ValueError(
            "Set --dataset_name (or dataset_name in the --config file): arithmetic, mod_search, toy_code, a file or a "
            "Hub id."
        )
    return script_args.dataset_name


def train_dataset(script_args: ScriptArguments, seed: int, bad_rows: str):
    name = dataset_name(script_args)
    for task in TASKS.values():  # a built-in task's dataset or offline generator, whichever --task is
        if task.generator(name) is not None or name == task.dataset_id:
            return task.train_dataset(name, script_args.dataset_train_split, seed, bad_rows)
    if name.endswith((".json", ".jsonl")):
        return load_dataset("json", data_files=name, split="train")
    return load_dataset(name, name=script_args.dataset_config, split=script_args.dataset_train_split)


if __name__ == "__main__":
    run = RecipeRun.parse(WorkflowArguments, paper_preset=PAPER_PRESET, cpu_preset=PAPER_PRESET.with_name("toy.yaml"))
    (workflow_args,) = run.own

    task = get_task(workflow_args.task)
    workflow_class = import_object(workflow_args.workflow)
    workflow = workflow_class(
        **{**run.options.for_workflow(workflow_class), **json.loads(workflow_args.workflow_kwargs)}
    )
    reward_funcs = [import_object(spec) for spec in workflow_args.reward_funcs] or None  # None: the task's
    dataset_name(run.script_args)  # none given: stop now, before --validate says all is well
    run.validate_if_asked(workflow, task)  # --validate: the trainer's checks, then exit; nothing loaded
    # the task's answer checker regrades each role's outputs where the dataset has the task's ground truth
    run.train(
        workflow,
        task,
        reward_funcs=reward_funcs,
        train_dataset=train_dataset(run.script_args, run.args.seed, run.args.bad_rows),
    )
