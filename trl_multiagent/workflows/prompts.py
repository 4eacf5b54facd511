r"""The built-in prompt sets, for ``task="math"`` and ``task="code"``, and how a workflow picks its set.

- ``"paper"``: each role gets what the research's reference workflows give it (the problem, the candidates or the
  conversation so far, its job and its output format) and nothing more; in particular no judge is told not to solve
  the problem, so a judge that drifts into re-solving can be observed. Written for ``EvalOpt(history="shared")``:
  the evaluator's and the refinement requests refer to the conversation above.
- ``"guarded"``: the library's earlier wording, kept word for word because the shipped toy model was trained on it
  (``recipes/configs/toy.yaml`` uses it). Judges are told not to solve the problem or write their own solution, every
  request is self-contained (so it works with ``history="fresh"``), and the problem is the row's whole user message.

Math answers go in ``\boxed{}``; code answers are Python in a ```` ```python ```` block, in the form the problem asks
for (DeepCoder has stdin/stdout programs and function-call problems, and each row's statement says which, so the
code prompts defer to it). The machine-read formats (``\boxed{Correct}``/``\boxed{Incorrect}``, ``\boxed{i}``,
``STRATEGY k:``) are the reference's, because ``common/parse_rules.py`` and the reported role behaviours depend on
them.
"""

from __future__ import annotations

import os
from typing import Any

from .prompt_set import PromptSet


def check_task(task: str) -> str:
    """Return ``task`` if the built-in prompts cover it, else raise a ``ValueError`` naming the valid tasks.

    The tasks are those of ``trl_multiagent.tasks.TASKS`` (which a workflow does not import: it knows nothing of
    datasets); each has its texts below, and ``tests/tasks/test_tasks_registry.py`` checks the two agree.
    """
    if task not in PROMPT_SETS["paper"]:
        valid = ", ".join(repr(name) for name in PROMPT_SETS["paper"])
        raise ValueError(f"Unknown task {task!r}; the built-in workflows support task={valid}.")
    return task


# ----------------------------------------------------------------------------------------------------- "paper"
_PAPER_ANSWER = {
    "math": "Put the final answer in \\boxed{}.",
    "code": "Write the complete program in one ```python code block.",
}
_PAPER_SOLVER = {
    "math": "Solve the following math problem, reasoning step by step.",
    "code": (
        "Solve the following programming problem in Python. The code must be correct, efficient, complete and "
        "runnable, and handle every edge case."
    ),
}
_PAPER_CHECK = {
    "math": "Check the reasoning and the final answer.",
    "code": (
        "Check the logic of the algorithm, the edge cases, implementation bugs and whether it is fast enough for "
        "the constraints. Judge the code by reading it: nothing is run."
    ),
}
_PAPER_SYNTHESIS = {
    "math": "Give the final answer in \\boxed{}.",
    "code": "Give the best solution as a complete, runnable program in one ```python code block.",
}
_PAPER_APPROACHES = {
    "math": "algebra, coordinates, trigonometric identities, a counting argument",
    "code": "greedy, dynamic programming, divide and conquer, brute force with pruning",
}


def _paper(task: str) -> PromptSet:
    solve = f"{_PAPER_SOLVER[task]} {_PAPER_ANSWER[task]}\n\nProblem:\n{{problem}}"
    subject = "math problem" if task == "math" else "programming problem"
    return PromptSet(
        solve=solve,
        evaluate=(
            "Review the solution above and decide whether it is correct. "
            f"{_PAPER_CHECK[task]}\n"
            "Give your verdict as \\boxed{Correct} or \\boxed{Incorrect}. If it is incorrect, say briefly what the "
            "main problem is. Do not reveal the correct answer."
        ),
        refine=(
            "Using the review above, write a new solution that takes a completely different approach from your "
            f"previous attempt and fixes the problems the review found. {_PAPER_ANSWER[task]}"
        ),
        vote=solve,
        aggregate=(
            f"Below are several solutions to the same {subject}. Choose the one most likely to be correct.\n\n"
            "Problem:\n{problem}\n\nSolutions:{solutions}\n\n"
            f"Examine each solution for correctness and completeness. {_PAPER_CHECK[task]} Give the number of the "
            "solution you choose as \\boxed{{N}}."
        ),
        propose=(
            f"Propose at most {{max_subtasks}} different strategies for solving the {subject} below, each a "
            "distinct method.\n\nProblem:\n{problem}\n\n"
            f"Consider different techniques (for example {_PAPER_APPROACHES[task]}). Describe each strategy briefly; "
            "describe the approaches only, without solving the problem. Use this format:\n{strategy_format}"
        ),
        work=(
            f"{_PAPER_SOLVER[task]} Use the strategy you are given as your main approach and solve the whole "
            f"problem. {_PAPER_ANSWER[task]}\n\nProblem:\n{{problem}}\n\nStrategy:\n{{strategy}}"
        ),
        synthesize=(
            f"Several solvers each solved the same {subject} with a different strategy. Compare their complete "
            "solutions and decide the correct answer.\n\nProblem:\n{problem}\n\nSolutions:{solutions}\n\n"
            f"{_PAPER_CHECK[task]} Solutions that agree give more confidence; where they disagree, decide which one "
            f"is right. {_PAPER_SYNTHESIS[task]}"
        ),
    )


# --------------------------------------------------------------------------------------------------- "guarded"
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
_FALLBACK_STRATEGY = (
    "No specific strategy was assigned to you. Use the approach you judge most reliable for this problem and "
    "verify the result before answering."
)


def _guarded(task: str) -> PromptSet:
    solve = f"{_SOLVER[task]}\n\nProblem:\n{{request}}\n\n{_ANSWER[task]}"
    return PromptSet(
        solve=solve,
        evaluate=(
            f"You are reviewing another solver's answer to a {_SUBJECT[task]}. Decide whether it is correct.\n\n"
            "Problem:\n{request}\n\nSolution under review:\n{solution}\n\n"
            f"{_CHECK[task]} If it is wrong, point out briefly where and why it fails. Do not solve the problem "
            "yourself and do not reveal the right answer.\n"
            "End with your verdict: \\boxed{Correct} or \\boxed{Incorrect}."
        ),
        refine=(
            "A reviewer judged your solution above and wrote:\n\n{feedback}\n\n"
            "Write a new solution. Address the reviewer's points, and try a different approach from your previous "
            f"attempt rather than patching it. {_ANSWER[task]}"
        ),
        vote=solve,
        aggregate=(
            f"Several solvers answered the same {_SUBJECT[task]} independently. Pick the solution most likely to be "
            "correct.\n\nProblem:\n{request}\n\n{solutions}\n\n"
            f"{_CHECK[task]} Do not write a solution of your own.\n"
            "End with the number of the solution you choose, from 1 to {n}, inside \\boxed{}."
        ),
        propose=(
            f"You plan how to attack a {_SUBJECT[task]}; other solvers will carry out the plan.\n\n"
            "Problem:\n{request}\n\n"
            f"Propose up to {{max_subtasks}} genuinely different strategies (for example: {_APPROACHES[task]}). "
            "Describe each in one or two sentences: the method and its key idea. Do not solve the problem and do "
            "not state an answer.\nWrite them in exactly this form:\n{strategy_format}"
        ),
        work=(
            f"{_SOLVER[task]}\n\nProblem:\n{{request}}\n\nStrategy to use: {{strategy}}\n\n"
            f"Solve the complete problem, following the strategy as your main line of attack. {_ANSWER[task]}"
        ),
        synthesize=(
            f"Several solvers attacked the same {_SUBJECT[task]}, each with a different strategy. Compare their "
            "solutions and decide the final answer.\n\nProblem:\n{request}\n\n{solutions}\n\n"
            f"{_CHECK[task]} Agreement between solutions raises confidence; where they disagree, work out which is "
            f"right. {_ANSWER[task]}"
        ),
        solution_block="--- Solution {index} ---\n{solution}",
        strategy_solution_block="--- Solution {index} ---\nStrategy: {strategy}\n\n{solution}",
        solutions_separator="\n\n",
        fallback_strategy=_FALLBACK_STRATEGY,
    )


PROMPT_SETS: dict[str, dict[str, PromptSet]] = {
    "paper": {task: _paper(task) for task in _PAPER_ANSWER},
    "guarded": {task: _guarded(task) for task in _ANSWER},
}


def resolve(prompts: str | dict[str, Any] | PromptSet, task: str) -> tuple[PromptSet, str | dict[str, str]]:
    """The prompt set a workflow was given, and how ``config_dict`` records it.

    ``prompts`` is a built-in name (``"paper"``, ``"guarded"``), the path of a JSON file in the reference's
    ``prompt.json`` layout, a ``PromptSet``, or a ``PromptSet.to_dict()``. A file or object is recorded by its
    templates, so a checkpoint rebuilds its workflow without the file.
    """
    if isinstance(prompts, PromptSet):
        return prompts, prompts.to_dict()
    if isinstance(prompts, dict):
        prompt_set = PromptSet.from_dict(prompts)
        return prompt_set, prompt_set.to_dict()
    if isinstance(prompts, str) and prompts in PROMPT_SETS:
        return PROMPT_SETS[prompts][check_task(task)], prompts
    if isinstance(prompts, str | os.PathLike) and os.path.isfile(prompts):
        prompt_set = PromptSet.from_json(prompts)
        return prompt_set, prompt_set.to_dict()
    raise ValueError(
        f"Unknown prompt set {prompts!r}: pass one of {sorted(PROMPT_SETS)}, the path of a JSON prompt file "
        "(the reference's prompt.json layout, see trl_multiagent.workflows.prompt_set), or a PromptSet."
    )
