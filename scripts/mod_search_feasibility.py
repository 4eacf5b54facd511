r"""How much verification and retries can buy on mod_search, before any model: scripted policies on held-out problems.

    python scripts/mod_search_feasibility.py                 # 1,000 held-out problems, a few seconds of CPU

No model and no RL: every role is the toy teacher's script (``scripts/build_toy_model.py``, ``SearchTeacher``), run
through the toy preset's real workflows (``trl_multiagent.evaluation.toy.WORKFLOWS``), and success is the math
reward of the final answer. These are the figures a toy model that imitated its teacher exactly would score, and,
with a judge that is always right (accuracy 1.0), what training the judges could reach. Printed:

1. per policy and judge accuracy, success on the held-out problems (k = 4 candidates) with its standard error and
   the mean number of model calls per episode:
   - one pass: the teacher's single agent (a uniform guess with its check);
   - one pass, check and switch: the written ceiling of one pass (``tasks/mod_search.py``): check a uniform
     candidate, box it if it gives the target, else box another one;
   - majority of 3 and best of 3 judged: the cost-matched single-agent baselines, three independent one-pass
     answers, then the most frequent (ties: the first) or the first the evaluator calls correct (else the last);
   - the toy preset's Eval-Opt (3 attempts, fresh history), Voting and Orch-Workers;
2. one pass, check and switch, best of 3 judged and Eval-Opt against k at the teacher's judge accuracy.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import random
import sys
from collections import Counter
from pathlib import Path

from trl_multiagent.evaluation.toy import WORKFLOWS
from trl_multiagent.tasks.math import extract_boxed, math_prompt
from trl_multiagent.tasks.mod_search import N_CANDIDATES, ModSearchProblem, make_mod_search_dataset
from trl_multiagent.tasks.registry import GENERATED_EVAL_SEED


def load_build():
    """scripts/build_toy_model.py as a module: its teacher's roles are the policies simulated here."""
    spec = importlib.util.spec_from_file_location("build_toy_model", Path(__file__).with_name("build_toy_model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def held_out(n: int, k: int) -> list[ModSearchProblem]:
    """The held-out problems (``eval_dataset("mod_search")`` for the default k), parsed back from their prompts."""
    rows = make_mod_search_dataset(n, seed=GENERATED_EVAL_SEED, n_candidates=k)
    return [ModSearchProblem.parse(row["prompt"][0]["content"]) for row in rows]


def boxed_int(text: str) -> int | None:
    boxed = extract_boxed(text)
    return int(boxed) if boxed is not None and boxed.isdigit() else None


class Policies:
    """Each policy plays one episode on a problem and returns (final answer, model calls)."""

    def __init__(self, build, accuracy: float, rng: random.Random):
        self.build, self.accuracy, self.rng = build, accuracy, rng

    def workflow(self, name: str, problem: ModSearchProblem) -> tuple[int | None, int]:
        records: list = []
        teacher = self.build.SearchTeacher(problem, self.rng, records, judge_accuracy=self.accuracy)
        final = asyncio.run(WORKFLOWS[name]("math").run(math_prompt(problem.text), teacher))
        return boxed_int(final), len(records)

    def one_pass(self, problem: ModSearchProblem) -> tuple[int | None, int]:
        return self.workflow("single_agent", problem)

    def check_and_switch(self, problem: ModSearchProblem) -> tuple[int | None, int]:
        checked = self.rng.choice(problem.candidates)
        if problem.accepts(checked):
            return checked, 1
        return self.rng.choice([x for x in problem.candidates if x != checked]), 1

    def majority_of_3(self, problem: ModSearchProblem) -> tuple[int | None, int]:
        answers = [self.one_pass(problem)[0] for _ in range(3)]
        return Counter(answers).most_common(1)[0][0], 3  # Counter keeps first-seen order among ties

    def best_of_3_judged(self, problem: ModSearchProblem) -> tuple[int | None, int]:
        answers = [self.one_pass(problem)[0] for _ in range(3)]
        for calls, x in enumerate(answers, start=1):
            review = self.build.search_review(problem, x, self.rng, self.accuracy)
            if extract_boxed(review) == "Correct":
                return x, 3 + calls
        return answers[-1], 6

    def eval_opt(self, problem):
        return self.workflow("eval_opt", problem)

    def voting(self, problem):
        return self.workflow("voting", problem)

    def orch_workers(self, problem):
        return self.workflow("orch_workers", problem)


POLICIES = {
    "one pass (single agent)": "one_pass",
    "one pass, check and switch (its ceiling)": "check_and_switch",
    "majority of 3 one-pass answers": "majority_of_3",
    "best of 3 one-pass answers, judged": "best_of_3_judged",
    "Eval-Opt, 3 attempts (fresh history)": "eval_opt",
    "Voting, 3 voters": "voting",
    "Orch-Workers, 3 workers": "orch_workers",
}


def measure(policy, problems: list[ModSearchProblem]) -> tuple[float, float, float]:
    """(success, its standard error, mean calls per episode)."""
    results = [policy(problem) for problem in problems]
    rate = sum(problem.accepts(x) for problem, (x, _) in zip(problems, results) if x is not None) / len(problems)
    return rate, math.sqrt(rate * (1 - rate) / len(problems)), sum(c for _, c in results) / len(results)


def policy_row(build, label: str, problems: list[ModSearchProblem], accuracies: list[float], seed: int) -> str:
    """The table's line of the policy ``label``, as printed: success % (standard error) and mean calls per episode
    at each judge accuracy, each measured with its own ``random.Random(seed)``."""
    cells = []
    for q in accuracies:
        rate, se, calls = measure(getattr(Policies(build, q, random.Random(seed)), POLICIES[label]), problems)
        cells.append(f"{100 * rate:.1f} ({100 * se:.1f}), {calls:.2f}")
    return f"| {label} | {' | '.join(cells)} |"


def k_cell(build, method: str, problems: list[ModSearchProblem], seed: int) -> str:
    """One cell of the table against k, as printed: success % (standard error) at the teacher's judge accuracy."""
    rate, se, _ = measure(getattr(Policies(build, build.SEARCH_JUDGE_ACCURACY, random.Random(seed)), method), problems)
    return f"{100 * rate:.1f} ({100 * se:.1f})"


K_METHODS = ("one_pass", "check_and_switch", "best_of_3_judged", "eval_opt")
PROBLEMS, SEED = 1000, 0  # the command's defaults, which record V1 ran with


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=PROBLEMS)
    parser.add_argument("--accuracies", type=float, nargs="+", default=[0.8, 0.9, 1.0], help="judge accuracies")
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 4, 5, 6], help="candidates per problem, table 2")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    build = load_build()

    problems = held_out(args.problems, N_CANDIDATES)
    print(f"mod_search, {args.problems} held-out problems, k = {N_CANDIDATES}; success % (standard error), calls")
    print(f"| policy | {' | '.join(f'judge accuracy {q}' for q in args.accuracies)} |")
    print(f"| --- |{' --- |' * len(args.accuracies)}")
    for label in POLICIES:
        print(policy_row(build, label, problems, args.accuracies, args.seed))

    print(f"\nagainst k, judge accuracy {build.SEARCH_JUDGE_ACCURACY}: success % (standard error)")
    print(f"| k | {' | '.join(K_METHODS)} |")
    print(f"| --- |{' --- |' * len(K_METHODS)}")
    for k in args.ks:
        problems_k = held_out(args.problems, k)
        print(f"| {k} | {' | '.join(k_cell(build, method, problems_k, args.seed) for method in K_METHODS)} |")


if __name__ == "__main__":
    main()
