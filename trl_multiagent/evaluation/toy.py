r"""Measure a policy on held-out toy problems: success per workflow and format-following per role.

    python -m trl_multiagent.evaluation.toy                                  # the shipped toy model
    python -m trl_multiagent.evaluation.toy --policy outputs/toy-eval-opt --workflows eval_opt
    python -m trl_multiagent.evaluation.toy --task code                      # toy_code, graded in the sandbox
    python -m trl_multiagent.evaluation.toy --policy /tmp/toy-search --dataset_name mod_search  # --search_problems

``--policy`` is ``toy``, a model folder (every role on the base model), or the ``output_dir`` of a training run
(its role adapters, routed as in training). This is the evaluator (``evaluator.py``: its episodes, task rewards and
success) on the toy tasks, with the toy preset's workflows and lengths: success is the task's reward on the final
answer (``math_reward`` on ``arithmetic``; ``CodeReward``, every test passing in the sandbox, on ``toy_code``) being
at least 1, greedy and as pass@1 (the mean over ``--samples`` sampled runs at temperature 0.7, each with its own
seed). A role follows its format when its output parses without the workflow's fallback (its declared format's
``parse``); role quality says how often each role is right (``workflows.correctness``, as monitoring and the
per-role rewards grade roles), judges against chance.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch
from datasets import Dataset

from ..checkpoints import CONFIG_NAME, TrainedWorkflow, load_base_workflow, load_trained_workflow
from ..cli.shipped import read_preset
from ..common.model_names import resolve_model_name
from ..rollout.records import Episode
from ..tasks import TASKS, get_task
from ..tasks.mod_search import ONE_CHECK_TOKENS
from ..workflows import EvalOpt, OrchWorkers, SingleAgent, Voting, Workflow
from ..workflows.correctness import grade_calls, solved
from ..workflows.options import WorkflowOptions
from .evaluator import EvalSettings, final_answer_rewards, sample_episodes

N_CANDIDATES = 3  # voters, workers and strategies in the built-in workflows' defaults
TOY_PRESET = read_preset("toy")  # recipes/configs/toy.yaml
MAX_NEW_TOKENS = TOY_PRESET["max_completion_length"]
# Generators whose tokens per call are part of the task: one mod_search check per call (recipes/grid.py's family).
BUDGETS = {"mod_search": ONE_CHECK_TOKENS}
# The requests the toy model was trained on: the toy preset's workflow options (it sets every one).
TOY = WorkflowOptions(**{name: TOY_PRESET[name] for name in WorkflowOptions.__dataclass_fields__})
# The toy preset's workflows, by name; each takes the task ("math": arithmetic, "code": toy_code).
WORKFLOWS = {
    "single_agent": lambda task="math": SingleAgent(template=TOY.template, prompts=TOY.prompts, task=task),
    "eval_opt": lambda task="math": EvalOpt(
        max_iterations=3 if task == "math" else 2,
        history=TOY.history,
        prompts=TOY.prompts,
        task=task,
        parsing=TOY.parsing,
    ),
    "voting": lambda task="math": Voting(n_voters=N_CANDIDATES, prompts=TOY.prompts, task=task, parsing=TOY.parsing),
    "orch_workers": lambda task="math": OrchWorkers(
        n_workers=N_CANDIDATES, workers=TOY.workers, prompts=TOY.prompts, task=task, parsing=TOY.parsing
    ),
}


def held_out_dataset(n: int = 300, task: str = "math", dataset: str | None = None) -> Dataset:
    """The first ``n`` held-out problems of one of the task's offline generators (``dataset``; default the task's
    own, ``arithmetic`` or ``toy_code``): the rows ``recipes/evaluate.py --dataset_name <dataset>`` scores with
    ``--limit n``."""
    spec = get_task(task)
    name = dataset or spec.generated
    if spec.generator(name) is None:
        known = list(spec.generators)
        raise ValueError(f"{name!r} is not an offline generator of the {task} task; its generators are {known}.")
    return spec.eval_dataset(name, limit=n)


def follows_format(workflow: Workflow, role: str, text: str) -> bool:
    """Whether a role's output parses under its declared format, without the workflow's fallback."""
    return workflow.formats[role].parse(text) is not None


def load_policy(
    policy: str, workflow_name: str, task: str = "math", role_models: dict[str, str] | None = None
) -> TrainedWorkflow:
    """``policy`` is ``"toy"`` or a model folder (every role on the base model, or on its ``role_models`` entry), or
    a run's ``output_dir`` (whose saved config names each role's base)."""
    workflow = WORKFLOWS[workflow_name](task)
    path = resolve_model_name(policy)
    if not os.path.isfile(os.path.join(path, CONFIG_NAME)):
        return load_base_workflow(path, workflow, role_models=role_models)
    if role_models:
        raise ValueError(f"{policy} is a trained run: its multiagent_config.json names each role's base model.")
    return load_trained_workflow(path, workflow=workflow)


def toy_settings(task: str, n: int, temperature: float, seed: int = 0, dataset: str | None = None) -> EvalSettings:
    """The evaluator's settings for one run over the first ``n`` held-out toy problems (of ``dataset``, default the
    task's generator): one episode each, all in one batch, at the toy preset's completion length (the generator's
    own where it has one, ``BUDGETS``)."""
    return EvalSettings(
        task=task,
        dataset_name=dataset or get_task(task).generated,
        limit=n,
        temperature=temperature,
        max_completion_length=BUDGETS.get(dataset, MAX_NEW_TOKENS),
        seed=seed,
        episodes_per_batch=max(n, 1),
        device="cpu",
    )


def run_toy(
    trained: TrainedWorkflow,
    rows: list[dict],
    task: str,
    temperature: float,
    seed: int = 0,
    dataset: str | None = None,
) -> list[Episode]:
    """One episode per row through the evaluator, all in one batch (``temperature=0``: greedy)."""
    settings = toy_settings(task, len(rows), temperature, seed, dataset)
    return [episode for _, batch in sample_episodes(trained, rows, settings) for episode in batch]


def successes(task: str, episodes: list[Episode], rows: list[dict]) -> list[bool]:
    """Whether each episode solved its row: the evaluator's success (``solved``) of the task reward."""
    return [solved(reward) for reward in final_answer_rewards(get_task(task).make_reward(), episodes, rows)]


def format_rates(workflow: Workflow, episodes) -> dict[str, float]:
    """Role -> share of its outputs in these episodes that follow its format."""
    ok = defaultdict(list)
    for call in (call for episode in episodes for call in episode.calls):
        ok[call.role].append(follows_format(workflow, call.role, call.text))
    return {role: sum(flags) / len(flags) for role, flags in sorted(ok.items())}


def graded(task: str, texts: list[str], rows: list[dict]) -> list[bool]:
    """Whether each text is a right answer to its row, under the task's reward (one batch: the sandbox runs the
    programs of a code batch in parallel)."""
    spec = get_task(task)
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    rewards = spec.make_reward()(completions, **{spec.ground_truth: [row[spec.ground_truth] for row in rows]})
    return [solved(reward) for reward in rewards]


def role_quality(
    workflow: Workflow, episodes: list[Episode], rows: list[dict], task: str = "math"
) -> dict[str, float]:
    """How often each role is right (``grade_calls``, a verdict that does not parse counting as wrong): every answer
    role (solvers), the verdicts on the attempts they review, and, where the candidates before it disagree, a
    selection's pick and an answer written from other roles' answers (``.../chance``: a random pick)."""
    formats = workflow.formats
    # Every answer, graded in one batch.
    keys = [
        (e, c) for e, ep in enumerate(episodes) for c, call in enumerate(ep.calls) if _kind(formats, call) == "answer"
    ]
    right = graded(task, [episodes[e].calls[c].text for e, c in keys], [rows[e] for e, _ in keys])
    answer_right: list[dict[int, bool]] = [{} for _ in episodes]
    for (e, c), value in zip(keys, right):
        answer_right[e][c] = value
    outcomes = defaultdict(list)
    for e, episode in enumerate(episodes):
        for call, grade in zip(
            episode.calls, grade_calls(formats, episode.calls, answer_right[e], strict_verdicts=True)
        ):
            if grade.right is None:
                continue
            if not grade.candidates:
                outcomes[f"{call.role}/accuracy"].append(grade.right)
            elif any(grade.candidates) and not all(grade.candidates):
                outcomes[f"{call.role}/accuracy"].append(grade.right)
                outcomes[f"{call.role}/chance"].append(sum(grade.candidates) / len(grade.candidates))
    return {key: sum(values) / len(values) for key, values in sorted(outcomes.items())}


def _kind(formats, call) -> str | None:
    return getattr(formats.get(call.role), "kind", None)


def evaluate(
    policy: str,
    workflow_name: str,
    n: int = 300,
    samples: int = 4,
    seed: int = 0,
    task: str = "math",
    role_models: dict[str, str] | None = None,
    dataset: str | None = None,
) -> dict:
    """Greedy success, pass@1 (mean success of ``samples`` runs at temperature 0.7) and per-role format rates
    (greedy, and over the sampled runs) and role quality (sampled) on the first ``n`` held-out problems of
    ``dataset`` (default: the task's generator)."""
    trained = load_policy(policy, workflow_name, task, role_models)
    rows = held_out_dataset(n, task, dataset).to_list()
    greedy = run_toy(trained, rows, task, temperature=0.0, dataset=dataset)
    every_sampled = [
        e
        for k in range(samples)
        for e in run_toy(trained, rows, task, temperature=0.7, seed=seed + k, dataset=dataset)
    ]
    solved_all = successes(
        task, greedy + every_sampled, rows * (samples + 1)
    )  # one batch: the sandbox runs it at once
    return {
        "workflow": workflow_name,
        "task": task,
        "problems": n,
        "greedy": sum(solved_all[:n]) / n,
        "pass@1": sum(solved_all[n:]) / (n * samples),
        "format_greedy": format_rates(trained.workflow, greedy),
        "format_sampled": format_rates(trained.workflow, every_sampled),
        "roles_sampled": role_quality(trained.workflow, every_sampled, rows * samples, task),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="toy", help="'toy', a model folder, or a training run's output_dir")
    parser.add_argument("--task", default="math", choices=list(TASKS), help="math: arithmetic; code: toy_code")
    parser.add_argument(
        "--dataset_name", default=None, help="another offline generator of the task (math: mod_search)"
    )
    parser.add_argument("--workflows", nargs="+", default=list(WORKFLOWS), choices=list(WORKFLOWS))
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--role_models",
        type=json.loads,
        default=None,
        help='untrained roles on other base models, e.g. \'{"evaluator": "toy-judge"}\' (a run names its own)',
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.workflows:
        result = evaluate(
            args.policy, name, args.problems, args.samples, args.seed, args.task, args.role_models, args.dataset_name
        )
        formats = ", ".join(f"{role} {rate:.1%}" for role, rate in result["format_sampled"].items())
        quality = ", ".join(f"{key} {rate:.1%}" for key, rate in result["roles_sampled"].items())
        print(f"{name}: greedy {result['greedy']:.1%}, pass@1 {result['pass@1']:.1%}")
        print(f"  format (sampled): {formats}\n  roles (sampled): {quality}")
        bases = {"role_models": args.role_models} if args.role_models else {}
        dataset = {"dataset": args.dataset_name} if args.dataset_name else {}
        print(json.dumps({"policy": args.policy, **bases, **dataset, **result}), flush=True)


if __name__ == "__main__":
    main()
