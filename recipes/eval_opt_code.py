"""Train Eval-Opt (generator + evaluator, refine on Incorrect) on DeepCoder with multi-agent GRPO.

Programs are graded in the code sandbox, which needs root (see ``trl_multiagent/tasks/sandbox.py``).

Paper-scale run (without --config the recipe reads recipes/configs/paper_code.yaml: Qwen3-1.7B, LoRA r=64/alpha=32
all-linear, 8 episodes per problem, lr 2e-5, T=0.7, 2048-token completions, DeepCoder PrimeIntellect):

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/eval_opt_code.py \
        --output_dir runs/eval_opt_code --policy_sharing isolated

A `--config` file stands in for it: one that names no `base:` starts from the library's defaults
(docs/configuration.md), one with `base: paper_code` from that file. `--print_config` prints every setting with
where it came from (library default, which preset file, command line) and exits without training;
`--validate` makes every check the trainer would make of these settings under this launch, loads nothing, and
exits (1 if refused).

TRL's model flags reach the model as in `trl grpo`: `--dtype`, `--attn_implementation` (e.g. flash_attention_2),
`--model_revision`, `--trust_remote_code`, and `--load_in_4bit` / `--load_in_8bit` for QLoRA (bitsandbytes, on a
GPU).

CPU, offline, minutes (tiny model, toy stdin/stdout problems):

    accelerate launch --cpu --num_processes 1 recipes/eval_opt_code.py --config recipes/configs/cpu_code.yaml
"""

from dataclasses import dataclass, field
from pathlib import Path

from trl_multiagent import EvalOpt
from trl_multiagent.cli.recipe_run import CodeRewardArguments, RecipeRun
from trl_multiagent.tasks import CodeReward, get_task

# The paper's settings; `--config other.yaml` stands in for this file (it starts from the library defaults unless it
# names `base: paper_code`).
PAPER_PRESET = Path(__file__).parent / "configs" / "paper_code.yaml"


@dataclass
class WorkflowArguments:
    max_iterations: int = field(
        default=2, metadata={"help": "Generator attempts per episode, each judged by the evaluator (paper: 2)."}
    )


if __name__ == "__main__":
    run = RecipeRun.parse(
        WorkflowArguments,
        CodeRewardArguments,
        paper_preset=PAPER_PRESET,
        cpu_preset=PAPER_PRESET.with_name("toy_code.yaml"),
    )
    workflow_args, reward_args = run.own

    task = get_task("code")  # DeepCoder, or `toy_code`: the offline toy task for CPU runs
    workflow = EvalOpt(
        max_iterations=workflow_args.max_iterations,
        task="code",
        prompts=run.options.prompts,
        parsing=run.options.parsing,
        history=run.options.history,
    )
    # --validate: the trainer's checks, then exit; else the model, dataset and trainer, then train, save, push
    run.train(workflow, task, reward_funcs=CodeReward(mode=reward_args.code_reward_mode))
