"""Train any workflow class with any reward functions: what `trl-multiagent train --workflow ...` runs.

Your workflow (a `trl_multiagent.workflows.Workflow` subclass) and rewards (TRL's signature
`(completions, **columns) -> list[float]`) are imported by name, so their package must be importable:

    accelerate launch --config_file accelerate_configs/cpu.yaml recipes/train.py --config recipes/configs/toy.yaml \
        --workflow my_package.flows:DraftCritique --reward_funcs my_package.rewards.score --output_dir outputs/mine

`--dataset_name` takes `arithmetic` (the offline toy task), `toy_code`, the DAPO-Math or DeepCoder Hub id, a local
`.json`/`.jsonl` file, or any Hub dataset with a conversational `prompt` column (and the columns your rewards read).
Without `--reward_funcs` the task's reward is used (`--task math`: math_reward; `code`: CodeReward()).
"""

import inspect
import json
from dataclasses import dataclass, field
from typing import Literal

from datasets import load_dataset
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.cli import import_object
from trl_multiagent.paper import MATH_MAX_COMPLETION_LENGTH, PAPER_DEFAULTS, WORKFLOW_PRESETS
from trl_multiagent.tasks import (
    DAPO_MATH_ID,
    DEEPCODER_ID,
    CodeReward,
    load_dapo_math,
    load_deepcoder,
    make_arithmetic_dataset,
    make_toy_code_dataset,
    math_answer_checker,
    math_reward,
)
from trl_multiagent.toy import resolve_model_name


@dataclass
class WorkflowArguments:
    workflow: str = field(
        default="trl_multiagent.workflows:EvalOpt",
        metadata={"help": "The workflow class, as package.module:Class (your package must be importable)."},
    )
    workflow_kwargs: str = field(default="{}", metadata={"help": 'JSON keyword arguments, e.g. \'{"task": "code"}\'.'})
    workflow_preset: str = field(
        default="paper",
        metadata={
            "help": "The built-in workflows' options (trl_multiagent.paper.WORKFLOW_PRESETS): the workflow class gets "
            "those its constructor takes; `workflow_kwargs` win over them.",
            "choices": list(WORKFLOW_PRESETS),
        },
    )
    reward_funcs: list[str] = field(
        default_factory=list, metadata={"help": "Reward functions as package.module.function (default: the task's)."}
    )
    task: Literal["math", "code"] = field(default="math", metadata={"help": "The default reward and datasets."})


def train_dataset(script_args: ScriptArguments, seed: int):
    name = script_args.dataset_name
    if name == "arithmetic":
        return make_arithmetic_dataset(n=1000, seed=seed)
    if name == "toy_code":
        return make_toy_code_dataset(n=1000, seed=seed)
    if name == DAPO_MATH_ID:
        return load_dapo_math(split=script_args.dataset_train_split)
    if name == DEEPCODER_ID:
        return load_deepcoder(split=script_args.dataset_train_split)
    if name.endswith((".json", ".jsonl")):
        return load_dataset("json", data_files=name, split="train")
    return load_dataset(name, name=script_args.dataset_config, split=script_args.dataset_train_split)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowArguments))
    parser.set_defaults(**PAPER_DEFAULTS, max_completion_length=MATH_MAX_COMPLETION_LENGTH, dataset_name=DAPO_MATH_ID)
    script_args, training_args, model_args, workflow_args = parser.parse_args_and_config()

    workflow_class = import_object(workflow_args.workflow)
    accepted = inspect.signature(workflow_class).parameters
    preset = {k: v for k, v in WORKFLOW_PRESETS[workflow_args.workflow_preset].items() if k in accepted}
    workflow = workflow_class(**{**preset, **json.loads(workflow_args.workflow_kwargs)})
    if workflow_args.reward_funcs:
        reward_funcs = [import_object(spec) for spec in workflow_args.reward_funcs]
    else:
        reward_funcs = math_reward if workflow_args.task == "math" else CodeReward()
    dataset = train_dataset(script_args, training_args.seed)
    regrade = workflow_args.task == "math" and "answer" in dataset.column_names  # per-role regrading
    trainer = MultiAgentGRPOTrainer(
        model=resolve_model_name(model_args.model_name_or_path),
        workflow=workflow,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
        answer_checker=math_answer_checker if regrade else None,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
