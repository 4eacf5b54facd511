"""Train Voting (N voters + aggregator) on DeepCoder with multi-agent GRPO.

Programs are graded in the code sandbox, which needs root (see ``trl_multiagent/tasks/sandbox.py``).

Paper-scale run (without --config the recipe reads recipes/configs/paper_code.yaml: Qwen3-1.7B, LoRA r=64/alpha=32
all-linear, 8 episodes per problem, lr 2e-5, T=0.7, 2048-token completions, DeepCoder PrimeIntellect):

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/voting_code.py \
        --output_dir runs/voting_code --policy_sharing isolated

A `--config` file stands in for it: one that names no `base:` starts from the library's defaults
(docs/configuration.md), one with `base: paper_code` from that file. `--print_config` prints every setting with
where it came from (library default, which preset file, command line) and exits without training;
`--validate` makes every check the trainer would make of these settings under this launch, loads nothing, and
exits (1 if refused).

CPU, offline, minutes (tiny model, toy stdin/stdout problems):

    accelerate launch --cpu --num_processes 1 recipes/voting_code.py --config recipes/configs/cpu_code.yaml
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trl import ModelConfig, ScriptArguments, get_peft_config

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting
from trl_multiagent.model_names import resolve_model_name
from trl_multiagent.recipe_parser import RecipeParser
from trl_multiagent.shipped import recipe_argv
from trl_multiagent.tasks import CodeReward, get_task
from trl_multiagent.workflows.options import WorkflowOptions

# The paper's settings; `--config other.yaml` stands in for this file (it starts from the library defaults unless it
# names `base: paper_code`).
PAPER_PRESET = Path(__file__).parent / "configs" / "paper_code.yaml"


@dataclass
class WorkflowArguments:
    n_voters: int = field(default=3, metadata={"help": "Independent generator answers the aggregator chooses from."})


@dataclass
class RewardArguments:
    code_reward_mode: Literal["all_pass", "fraction"] = field(
        default="all_pass",
        metadata={"help": "all_pass (the paper's): 1 only if every test passes; fraction: share of tests passed."},
    )


if __name__ == "__main__":
    parser = RecipeParser(
        (ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions, WorkflowArguments, RewardArguments),
        validates=True,
    )
    argv = recipe_argv(sys.argv, paper_preset=PAPER_PRESET, cpu_preset=PAPER_PRESET.with_name("toy_code.yaml"))
    script_args, training_args, model_args, options, workflow_args, reward_args = parser.parse_args_and_config(argv)

    task = get_task("code")  # DeepCoder, or `toy_code`: the offline toy task for CPU runs
    workflow = Voting(
        n_voters=workflow_args.n_voters,
        task="code",
        prompts=options.prompts,
        parsing=options.parsing,
    )
    parser.validate_if_asked(workflow, task)  # --validate: the trainer's checks, then exit; nothing loaded
    train_dataset = task.train_dataset(
        script_args.dataset_name, script_args.dataset_train_split, training_args.seed, training_args.bad_rows
    )

    trainer = MultiAgentGRPOTrainer(
        model=resolve_model_name(model_args.model_name_or_path),
        workflow=workflow,
        reward_funcs=CodeReward(mode=reward_args.code_reward_mode),
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
