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
"""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import load_dataset
from trl import ModelConfig, ScriptArguments, get_peft_config

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.cli import import_object
from trl_multiagent.model_names import resolve_model_name
from trl_multiagent.recipe_parser import RecipeParser
from trl_multiagent.shipped import recipe_argv
from trl_multiagent.tasks import TASKS, get_task
from trl_multiagent.workflows.options import WorkflowOptions

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
    parser = RecipeParser(
        (ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions, WorkflowArguments), validates=True
    )
    argv = recipe_argv(sys.argv, paper_preset=PAPER_PRESET, cpu_preset=PAPER_PRESET.with_name("toy.yaml"))
    script_args, training_args, model_args, options, workflow_args = parser.parse_args_and_config(argv)

    workflow_class = import_object(workflow_args.workflow)
    workflow = workflow_class(**{**options.for_workflow(workflow_class), **json.loads(workflow_args.workflow_kwargs)})
    if workflow_args.reward_funcs:
        reward_funcs = [import_object(spec) for spec in workflow_args.reward_funcs]
    else:
        reward_funcs = get_task(workflow_args.task).make_reward()
    dataset_name(script_args)  # none given: stop now, before --validate says all is well
    parser.validate_if_asked(workflow, get_task(workflow_args.task))  # --validate: the trainer's checks, then exit
    dataset = train_dataset(script_args, training_args.seed, training_args.bad_rows)
    checker = get_task(workflow_args.task).answer_checker  # per-role regrading against the ground truth
    regrade = checker is not None and get_task(workflow_args.task).ground_truth in dataset.column_names
    trainer = MultiAgentGRPOTrainer(
        model=resolve_model_name(model_args.model_name_or_path),
        workflow=workflow,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
        answer_checker=checker if regrade else None,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
