"""Evaluate a trained run (every checkpoint), the base model, or SA-RL transfer on a task's held-out split.

Every checkpoint of a run as the paper evaluates it (recipes/configs/paper_eval.yaml, read when no --config is given:
sampled at 0.7, Qwen3's thinking off, the held-out split, up to 8,192 tokens per call for math and 5,120 for code;
`--use_training_lengths`: the training lengths, 5,120 and 2,048), appending to runs/voting_math/eval_results.jsonl
(re-running skips what is done):

    python recipes/evaluate.py --run_dir runs/voting_math --task math --limit 500

A `--config` file stands in for paper_eval.yaml: one that names no `base:` starts from EvalSettings' defaults (greedy,
the tokenizer's chat template), one with `base: paper_eval` from that file; `--print_config` prints every setting with
where it came from and exits without evaluating.

4 episodes per problem (pass@1 = mean over the 4, and pass@4); greedy with --temperature 0:

    python recipes/evaluate.py --run_dir runs/voting_math --task math --k 4

The other modes (``--mode``):

    # the untrained base model in every role of the run's workflow (step 0)
    python recipes/evaluate.py --run_dir runs/voting_math --mode base
    # ... or of a built-in workflow, without any run
    python recipes/evaluate.py --mode base --workflow voting --base_model Qwen/Qwen3-1.7B --output_dir runs/base
    # SA-RL in the same structure: the single-agent adapter in every role of Voting (exact parameters of a run)
    python recipes/evaluate.py --run_dir runs/single_agent_math --mode transfer --workflow runs/voting_math
    # the generator of a workflow run, alone (SingleAgent)
    python recipes/evaluate.py --run_dir runs/eval_opt_math --mode generator_alone
    # the run's generator with an untrained evaluator; or with another run's evaluator
    python recipes/evaluate.py --run_dir runs/eval_opt_math --role_policies evaluator=base
    python recipes/evaluate.py --run_dir runs/eval_opt_math --role_policies evaluator=runs/other/checkpoint-500
    # only the newest checkpoint (e.g. pass@1 over 4 samples, beside greedy accuracy at every checkpoint)
    python recipes/evaluate.py --run_dir runs/voting_math --checkpoints final --k 4
    # which role's training brought the gain: every subset of the adapters trained/base, Shapley shares
    python recipes/evaluate.py --run_dir runs/eval_opt_math --attribution --limit 500
    # the cost-matched SA-RL baseline: each episode is N samples of SA-RL, the majority answer graded; N given,
    # or read from a workflow run's evaluation with the same flags (its calls per episode, rounded up)
    python recipes/evaluate.py --run_dir runs/single_agent_math --best_of 3 --select majority
    python recipes/evaluate.py --run_dir runs/single_agent_math --best_of_calls runs/eval_opt_math
    # ... N samples, the answer chosen by a trained Eval-Opt evaluator (majority among those it accepts)
    python recipes/evaluate.py --run_dir runs/single_agent_math --best_of_calls runs/eval_opt_math --select judge \
        --judge runs/eval_opt_math

CPU, offline (tiny model, toy arithmetic task):

    python recipes/evaluate.py --run_dir outputs/cpu-run --dataset_name arithmetic --limit 20 \
        --max_completion_length 24 --temperature 0
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl_multiagent.checkpoints import BUILT_IN_WORKFLOWS, read_multiagent_config, workflow_from_config
from trl_multiagent.cli.recipe_parser import RecipeParser
from trl_multiagent.evaluation import (
    MODES,
    EvalSettings,
    evaluate,
    format_table,
    list_checkpoints,
    paper_table,
    parse_role_policies,
    read_results,
)
from trl_multiagent.evaluation.attribution import format_attribution, run_attribution
from trl_multiagent.workflows import Workflow

# The paper's evaluation settings; `--config other.yaml` stands in for this file (it starts from EvalSettings'
# defaults unless it names `base: paper_eval`).
PAPER_PRESET = Path(__file__).parent / "configs" / "paper_eval.yaml"
RECIPE_NAMES = {
    "eval_opt": "EvalOpt",
    "voting": "Voting",
    "orch_workers": "OrchWorkers",
    "single_agent": "SingleAgent",
}


@dataclass
class EvaluateArguments:
    run_dir: str | None = field(default=None, metadata={"help": "A run's output_dir (all its checkpoint-N) or one."})
    mode: str = field(default="trained", metadata={"help": "What answers for each role.", "choices": list(MODES)})
    workflow: str | None = field(
        default=None,
        metadata={
            "help": "Workflow to run instead of the run's own: eval_opt, voting, orch_workers, single_agent (paper "
            "defaults for --task), or a run folder to copy the exact workflow from. Required for transfer."
        },
    )
    base_model: str | None = field(default=None, metadata={"help": "Base model; default: the run's."})
    alone_role: str = field(default="generator", metadata={"help": "Role evaluated by generator_alone."})
    output_dir: str | None = field(default=None, metadata={"help": "Where results go; default: --run_dir."})
    attribution: bool = field(
        default=False,
        metadata={
            "help": "Evaluate the final checkpoint with every subset of its adapters trained and the rest on the base "
            "model (2^k for k <= 4 adapters; else each alone and each left out) and print each role's Shapley "
            "share of the gain, with bootstrap intervals over problems. Subsets already evaluated are read back."
        },
    )
    bootstrap: int = field(default=1000, metadata={"help": "With --attribution: resamplings of the problems."})
    checkpoints: str = field(
        default="all",
        metadata={
            "help": "'all': every checkpoint-N of --run_dir; 'final': only the newest (e.g. a costly sampled "
            "evaluation beside greedy accuracy at every step).",
            "choices": ["all", "final"],
        },
    )
    best_of_calls: str | None = field(
        default=None,
        metadata={
            "help": "A workflow run folder: set --best_of to its measured model calls per episode (its newest "
            "evaluation with the same settings, mean_calls rounded up): SA-RL sampled as often as the workflow "
            "calls its model, the cost-matched baseline."
        },
    )
    role_policies: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Trained mode: role=base (the role's calls go to the base model), role=trained (the default) or "
            "role=path/to/checkpoint (another run's adapter for that role), e.g. --role_policies evaluator=base."
        },
    )


def resolve_workflow(spec: str | None, task: str) -> Workflow | None:
    if spec is None:
        return None
    if Path(spec).is_dir():
        _, checkpoint = list_checkpoints(spec)[-1]
        return workflow_from_config(read_multiagent_config(checkpoint)["workflow"])
    name = RECIPE_NAMES.get(spec, spec)
    if name not in BUILT_IN_WORKFLOWS:
        raise ValueError(f"--workflow {spec!r} is neither a run folder nor one of {sorted(RECIPE_NAMES)}.")
    if name == "EvalOpt":  # the paper: 3 attempts for math, 2 for code
        return BUILT_IN_WORKFLOWS[name](max_iterations=3 if task == "math" else 2, task=task)
    return BUILT_IN_WORKFLOWS[name](task=task)


if __name__ == "__main__":
    parser = RecipeParser((EvaluateArguments, EvalSettings))
    argv = sys.argv[1:] if "--config" in sys.argv else ["--config", str(PAPER_PRESET), *sys.argv[1:]]
    args, settings = parser.parse_args_and_config(argv)
    if args.run_dir is not None and not Path(args.run_dir).is_dir():  # one line, not a traceback from deep inside
        raise SystemExit(
            f"evaluate: --run_dir {args.run_dir}: no such folder (a training run's --output_dir, or one of "
            "its checkpoint-N folders)."
        )
    if args.attribution:
        if args.mode != "trained" or args.role_policies:
            raise ValueError("--attribution sets every role's policy itself: drop --mode and --role_policies.")
        result = run_attribution(
            args.run_dir,
            settings,
            output_dir=args.output_dir,
            workflow=resolve_workflow(args.workflow, settings.task),
            bootstrap=args.bootstrap,
        )
        print(f"{result['evaluated']} subset(s) evaluated now, {len(result['subsets']) - result['evaluated']} read")
        print(format_attribution(result))
        sys.exit(0)
    new_rows = evaluate(
        run_dir=args.run_dir,
        mode=args.mode,
        settings=settings,
        output_dir=args.output_dir,
        workflow=resolve_workflow(args.workflow, settings.task),
        base_model=args.base_model,
        alone_role=args.alone_role,
        role_policies=parse_role_policies(args.role_policies),
        final_only=args.checkpoints == "final",
        best_of_calls=args.best_of_calls,
    )
    for row in new_rows:
        chosen = f" (best of {row['best_of']}, {row['select']})" if "best_of" in row else ""
        print(f"step {row['step']}: accuracy {row['accuracy']:.3f}{chosen}  pass@{row['k']} {row['pass_at_k']:.3f}")
    output_dir = args.output_dir or args.run_dir
    print(f"{len(new_rows)} new evaluation(s) in {output_dir}\n")
    print(format_table(paper_table(read_results(output_dir))))
