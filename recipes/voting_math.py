"""Train Voting (N voters + aggregator) on DAPO-Math-17K with multi-agent GRPO.

Paper-scale run (without --config the recipe reads recipes/configs/paper_math.yaml: Qwen3-1.7B, LoRA r=64/alpha=32
all-linear, 8 episodes per problem, lr 2e-5, T=0.7):

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/voting_math.py \
        --output_dir runs/voting_math --policy_sharing isolated

A `--config` file stands in for it: one that names no `base:` starts from the library's defaults
(docs/configuration.md), one with `base: paper_math` from that file. `--print_config` prints every setting with
where it came from (library default, which preset file, command line) and exits without training;
`--validate` makes every check the trainer would make of these settings under this launch, loads nothing, and
exits (1 if refused).

TRL's model flags reach the model as in `trl grpo`: `--dtype`, `--attn_implementation` (e.g. flash_attention_2),
`--model_revision`, `--trust_remote_code`, and `--load_in_4bit` / `--load_in_8bit` for QLoRA (bitsandbytes, on a
GPU).

CPU, offline, minutes (tiny model, toy arithmetic task):

    accelerate launch --cpu --num_processes 1 recipes/voting_math.py --config recipes/configs/cpu.yaml
"""

from dataclasses import dataclass, field
from pathlib import Path

from trl_multiagent import Voting
from trl_multiagent.cli.recipe_run import RecipeRun
from trl_multiagent.tasks import get_task

# The paper's settings; `--config other.yaml` stands in for this file (it starts from the library defaults unless it
# names `base: paper_math`).
PAPER_PRESET = Path(__file__).parent / "configs" / "paper_math.yaml"


@dataclass
class WorkflowArguments:
    n_voters: int = field(default=3, metadata={"help": "Independent generator answers the aggregator chooses from."})


if __name__ == "__main__":
    run = RecipeRun.parse(WorkflowArguments, paper_preset=PAPER_PRESET, cpu_preset=PAPER_PRESET.with_name("toy.yaml"))
    (workflow_args,) = run.own

    task = get_task("math")  # DAPO-Math-17K, or `arithmetic`: the offline toy task for CPU runs
    workflow = Voting(
        n_voters=workflow_args.n_voters,
        prompts=run.options.prompts,
        parsing=run.options.parsing,
    )
    # --validate: the trainer's checks, then exit; else the model, dataset and trainer, then train, save, push
    run.train(workflow, task)
