"""Train Voting (N voters + aggregator) on DeepCoder with multi-agent GRPO.

Programs are graded in the code sandbox, which needs root (see ``trl_multiagent/tasks/sandbox.py``).

Paper-scale run (defaults: Qwen3-1.7B, LoRA r=64/alpha=32 all-linear, 8 episodes per problem, lr 2e-5, T=0.7,
2048-token completions, DeepCoder PrimeIntellect):

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/voting_code.py \
        --output_dir runs/voting_code --policy_sharing isolated

CPU, offline, minutes (tiny model, toy stdin/stdout problems):

    accelerate launch --cpu --num_processes 1 recipes/voting_code.py --config recipes/configs/cpu_code.yaml
"""

from dataclasses import dataclass, field
from typing import Literal

from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting
from trl_multiagent.paper import CODE_MAX_COMPLETION_LENGTH, PAPER_DEFAULTS, WORKFLOW_PRESETS
from trl_multiagent.tasks import DEEPCODER_ID, CodeReward, load_deepcoder, make_toy_code_dataset
from trl_multiagent.toy import resolve_model_name


@dataclass
class WorkflowArguments:
    n_voters: int = field(default=3, metadata={"help": "Independent generator answers the aggregator chooses from."})
    workflow_preset: str = field(
        default="paper",
        metadata={
            "help": "What the roles see: 'paper' (the research's workflows) or 'toy' (the requests the toy model was "
            "trained on); see trl_multiagent.paper.WORKFLOW_PRESETS.",
            "choices": list(WORKFLOW_PRESETS),
        },
    )
    prompts: str | None = field(
        default=None,
        metadata={
            "help": "Prompt set: 'paper', 'guarded', or a JSON file in the reference's prompt.json layout "
            "(default: the preset's)."
        },
    )


@dataclass
class RewardArguments:
    code_reward_mode: Literal["all_pass", "fraction"] = field(
        default="all_pass",
        metadata={"help": "all_pass (the paper's): 1 only if every test passes; fraction: share of tests passed."},
    )


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowArguments, RewardArguments))
    parser.set_defaults(**PAPER_DEFAULTS, max_completion_length=CODE_MAX_COMPLETION_LENGTH, dataset_name=DEEPCODER_ID)
    script_args, training_args, model_args, workflow_args, reward_args = parser.parse_args_and_config()

    if script_args.dataset_name == "toy_code":  # offline toy task for CPU runs
        train_dataset = make_toy_code_dataset(n=1000, seed=training_args.seed)
    else:
        train_dataset = load_deepcoder(split=script_args.dataset_train_split, path_or_id=script_args.dataset_name)

    preset = WORKFLOW_PRESETS[workflow_args.workflow_preset]
    trainer = MultiAgentGRPOTrainer(
        model=resolve_model_name(model_args.model_name_or_path),
        workflow=Voting(
            n_voters=workflow_args.n_voters,
            task="code",
            prompts=workflow_args.prompts or preset["prompts"],
            parsing=preset["parsing"],
        ),
        reward_funcs=CodeReward(mode=reward_args.code_reward_mode),
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
