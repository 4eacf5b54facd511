"""Train Orch-Workers (orchestrator + N workers + synthesizer) on DAPO-Math-17K with multi-agent GRPO.

Paper-scale run (without --config the recipe reads recipes/configs/paper_math.yaml: Qwen3-1.7B, LoRA r=64/alpha=32
all-linear, 8 episodes per problem, lr 2e-5, T=0.7):

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/orch_workers_math.py \
        --output_dir runs/orch_workers_math --policy_sharing isolated

A `--config` file stands in for it: one that names no `base:` starts from the library's defaults
(docs/configuration.md), one with `base: paper_math` from that file. `--print_config` prints every setting with
where it came from (library default, which preset file, command line) and exits without training;
`--validate` makes every check the trainer would make of these settings under this launch, loads nothing, and
exits (1 if refused).

CPU, offline, minutes (tiny model, toy arithmetic task):

    accelerate launch --cpu --num_processes 1 recipes/orch_workers_math.py --config recipes/configs/cpu.yaml
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, ScriptArguments, get_peft_config

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, OrchWorkers
from trl_multiagent.model_names import resolve_model_name
from trl_multiagent.recipe_parser import RecipeParser
from trl_multiagent.shipped import recipe_argv
from trl_multiagent.tasks import get_task
from trl_multiagent.workflows.options import WorkflowOptions

# The paper's settings; `--config other.yaml` stands in for this file (it starts from the library defaults unless it
# names `base: paper_math`).
PAPER_PRESET = Path(__file__).parent / "configs" / "paper_math.yaml"


@dataclass
class WorkflowArguments:
    n_workers: int = field(default=3, metadata={"help": "Strategies proposed by the orchestrator, one worker each."})


if __name__ == "__main__":
    parser = RecipeParser(
        (ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions, WorkflowArguments), validates=True
    )
    argv = recipe_argv(sys.argv, paper_preset=PAPER_PRESET, cpu_preset=PAPER_PRESET.with_name("toy.yaml"))
    script_args, training_args, model_args, options, workflow_args = parser.parse_args_and_config(argv)

    task = get_task("math")  # DAPO-Math-17K, or `arithmetic`: the offline toy task for CPU runs
    workflow = OrchWorkers(
        n_workers=workflow_args.n_workers,
        prompts=options.prompts,
        parsing=options.parsing,
        workers=options.workers,
    )
    parser.validate_if_asked(workflow, task)  # --validate: the trainer's checks, then exit; nothing loaded
    train_dataset = task.train_dataset(
        script_args.dataset_name, script_args.dataset_train_split, training_args.seed, training_args.bad_rows
    )

    trainer = MultiAgentGRPOTrainer(
        model=resolve_model_name(model_args.model_name_or_path),
        workflow=workflow,
        reward_funcs=task.make_reward(),
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
        answer_checker=task.answer_checker,  # per-role regrading against `answer`
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
