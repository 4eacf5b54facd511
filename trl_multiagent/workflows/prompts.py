r"""Role prompts of the built-in workflows, for ``task="math"`` and ``task="code"``.

Each function returns the text of one user message. Math answers go in ``\boxed{}``; code answers are Python in a
```` ```python ```` block in the form the problem statement asks for: a program that reads standard input and writes
standard output, or the function the tests call. DeepCoder has both kinds and each row's problem says which, so the
code prompts defer to it rather than contradict it. The machine-read formats (``\boxed{Correct}``/
``\boxed{Incorrect}``, ``\boxed{i}``, ``STRATEGY k:``, ``--- Solution i ---``) follow the paper's reference
workflows, because ``parsing.py`` and the reported role behaviours depend on them.
"""

from __future__ import annotations

TASKS = ("math", "code")

# Phrases that differ between tasks; the role templates below are shared so both tasks ask the same of a role.
_SUBJECT = {"math": "math problem", "code": "programming problem"}
_SOLVER = {
    "math": "You solve math problems carefully, reasoning step by step.",
    "code": "You are an experienced competitive programmer who writes correct, efficient Python.",
}
_ANSWER = {
    "math": "Give the final answer, and only the answer, inside \\boxed{}.",
    "code": (
        "Give the complete solution in a single ```python code block, in the form the problem asks for: a program "
        "that reads standard input and prints to standard output, or the function the problem names."
    ),
}
_CHECK = {
    "math": "Check each step of the reasoning and the final answer.",
    "code": (
        "Check the algorithm's logic, the handling of edge cases, implementation bugs, whether it is fast enough "
        "for the constraints, and whether it has the form the problem asks for (a program reading standard input, "
        "or the function the problem names). Judge by reading the code; you cannot run it."
    ),
}
_APPROACHES = {
    "math": "algebraic manipulation, casework, a geometric or coordinate argument, counting in two ways",
    "code": "a greedy rule, dynamic programming, binary search on the answer, graph search, brute force with pruning",
}

# Given to a worker when the orchestrator proposed fewer strategies than there are workers (or none parseable):
# the worker still solves the problem, as an independent sample, instead of the episode failing.
FALLBACK_STRATEGY = (
    "No specific strategy was assigned to you. Use the approach you judge most reliable for this problem and "
    "verify the result before answering."
)


def check_task(task: str) -> str:
    """Return ``task`` if the built-in prompts cover it, else raise a ``ValueError`` naming the valid tasks."""
    if task not in TASKS:
        valid = ", ".join(repr(name) for name in TASKS)
        raise ValueError(f"Unknown task {task!r}; the built-in workflows support task={valid}.")
    return task


def _solution_blocks(solutions: list[str], strategies: list[str] | None = None) -> str:
    blocks = []
    for i, solution in enumerate(solutions):
        strategy = f"Strategy: {strategies[i]}\n\n" if strategies else ""
        blocks.append(f"--- Solution {i + 1} ---\n{strategy}{solution}")
    return "\n\n".join(blocks)


def solve(problem: str, task: str) -> str:
    """The generator's (and each voter's) first request: solve the problem."""
    return f"{_SOLVER[task]}\n\nProblem:\n{problem}\n\n{_ANSWER[task]}"


def evaluate(problem: str, solution: str, task: str) -> str:
    """The evaluator's request: critique one solution and give a verdict, without solving the problem itself."""
    return (
        f"You are reviewing another solver's answer to a {_SUBJECT[task]}. Decide whether it is correct.\n\n"
        f"Problem:\n{problem}\n\nSolution under review:\n{solution}\n\n"
        f"{_CHECK[task]} If it is wrong, point out briefly where and why it fails. Do not solve the problem "
        "yourself and do not reveal the right answer.\n"
        "End with your verdict: \\boxed{Correct} or \\boxed{Incorrect}."
    )


def refine(feedback: str, task: str) -> str:
    """The generator's follow-up after a rejected attempt; its previous attempt is the turn just before."""
    return (
        f"A reviewer judged your solution above and wrote:\n\n{feedback}\n\n"
        "Write a new solution. Address the reviewer's points, and try a different approach from your previous "
        f"attempt rather than patching it. {_ANSWER[task]}"
    )


def aggregate(problem: str, solutions: list[str], task: str) -> str:
    """The aggregator's request: pick the candidate most likely to be correct, by number."""
    n = len(solutions)
    return (
        f"Several solvers answered the same {_SUBJECT[task]} independently. Pick the solution most likely to be "
        f"correct.\n\nProblem:\n{problem}\n\n{_solution_blocks(solutions)}\n\n"
        f"{_CHECK[task]} Do not write a solution of your own.\n"
        f"End with the number of the solution you choose, from 1 to {n}, inside \\boxed{{}}."
    )


def propose(problem: str, n: int, task: str) -> str:
    """The orchestrator's request: up to ``n`` different strategies, described but not carried out."""
    format_lines = "\n".join(f"STRATEGY {k}: <strategy>" for k in range(1, n + 1))
    return (
        f"You plan how to attack a {_SUBJECT[task]}; other solvers will carry out the plan.\n\n"
        f"Problem:\n{problem}\n\n"
        f"Propose up to {n} genuinely different strategies (for example: {_APPROACHES[task]}). Describe each in one "
        "or two sentences: the method and its key idea. Do not solve the problem and do not state an answer.\n"
        f"Write them in exactly this form:\n{format_lines}"
    )


def work(problem: str, strategy: str, task: str) -> str:
    """A worker's request: solve the whole problem with the assigned strategy."""
    return (
        f"{_SOLVER[task]}\n\nProblem:\n{problem}\n\nStrategy to use: {strategy}\n\n"
        f"Solve the complete problem, following the strategy as your main line of attack. {_ANSWER[task]}"
    )


def synthesize(problem: str, strategies: list[str], solutions: list[str], task: str) -> str:
    """The synthesizer's request: compare the workers' solutions and give the final answer."""
    return (
        f"Several solvers attacked the same {_SUBJECT[task]}, each with a different strategy. Compare their "
        f"solutions and decide the final answer.\n\nProblem:\n{problem}\n\n"
        f"{_solution_blocks(solutions, strategies)}\n\n"
        f"{_CHECK[task]} Agreement between solutions raises confidence; where they disagree, work out which is "
        f"right. {_ANSWER[task]}"
    )
