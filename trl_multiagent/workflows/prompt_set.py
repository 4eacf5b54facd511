r"""``PromptSet``: the text of every role's request in the built-in workflows, for one task.

Built-in sets are named (``prompts.PROMPT_SETS``); any other text comes from a JSON file laid out like the reference
implementation's ``prompt.json``, so a user can point a workflow at that file or at an edited copy::

    {
      "evaluator_optimizer_prompts": {
        "generator_initial":    {"template": "... {problem} ..."},      # PromptSet.solve
        "evaluator_critique":   {"template": "..."},                    # PromptSet.evaluate
        "generator_refinement": {"template": "..."}                     # PromptSet.refine
      },
      "voting_prompts": {
        "generator":  {"template": "... {problem} ..."},                # PromptSet.vote
        "aggregator": {"template": "... {problem} ... {solutions} ..."} # PromptSet.aggregate
      },
      "orchestrator_workers_prompts": {
        "orchestrator_propose": {"template": "... {max_subtasks} ... {problem} ..."},  # PromptSet.propose
        "worker_full_solve":    {"template": "... {problem} ... {strategy} ..."},      # PromptSet.work
        "orchestrator_compare": {"template": "... {problem} ... {solutions} ..."}      # PromptSet.synthesize
      },
      "trl_multiagent": {                                                # optional, defaults below
        "solution_block": "...", "strategy_solution_block": "...", "solutions_separator": "...",
        "fallback_strategy": "..."
      }
    }

Every section may carry the prefix ``deepcoder_`` (the reference's DeepCoder file); other sections and keys
(``metadata``, ``description``, ``required_variables``) are ignored. A value may be ``{"template": text}`` or the text
itself. A missing template fails when the set is built, naming the section and key.

Templates use Python's ``str.format`` placeholders: ``{name}`` is replaced when ``name`` is one of the template's
variables (below), ``{{`` and ``}}`` are literal braces, and any other ``{...}`` is kept as written, so
``\boxed{Correct}`` needs no escaping. Variables:

- every request but ``refine``: ``{problem}`` (the problem statement, without the dataset's answer-format
  instruction: see ``base.problem_text``) and ``{request}`` (the row's whole last user message);
- ``evaluate``: ``{solution}``, the attempt under review (needed with ``EvalOpt(history="fresh")``; in the shared
  history the attempt is the assistant turn just above);
- ``refine``: ``{feedback}``, the evaluator's output (needed with ``history="fresh"``);
- ``aggregate``, ``synthesize``: ``{solutions}`` (the candidates, each rendered with ``solution_block`` /
  ``strategy_solution_block``, joined by ``solutions_separator``) and ``{n}`` (their number). By default the
  reference's layout: each block is ``\n--- Solution i ---\n<solution>\n`` (``--- Solution i (Strategy: <strategy>)
  ---`` under Orch-Workers), joined with nothing, so ``{solutions}`` starts on a new line and ends with one, as the
  reference's templates (``Solutions to review:{solutions}``) expect;
- ``propose``: ``{max_subtasks}`` (the most strategies wanted) and ``{strategy_format}`` (``STRATEGY 1: <strategy>``
  lines, one per strategy);
- ``work``: ``{strategy}``;
- ``solution_block``: ``{index}`` (1-based), ``{solution}``; ``strategy_solution_block``: also ``{strategy}``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

# PromptSet field -> (reference prompt.json section, key)
FILE_KEYS = {
    "solve": ("evaluator_optimizer_prompts", "generator_initial"),
    "evaluate": ("evaluator_optimizer_prompts", "evaluator_critique"),
    "refine": ("evaluator_optimizer_prompts", "generator_refinement"),
    "vote": ("voting_prompts", "generator"),
    "aggregate": ("voting_prompts", "aggregator"),
    "propose": ("orchestrator_workers_prompts", "orchestrator_propose"),
    "work": ("orchestrator_workers_prompts", "worker_full_solve"),
    "synthesize": ("orchestrator_workers_prompts", "orchestrator_compare"),
}
OPTIONAL_SECTION = "trl_multiagent"
_PROBLEM = ("problem", "request")
VARIABLES = {
    "solve": _PROBLEM,
    "evaluate": (*_PROBLEM, "solution"),
    "refine": ("feedback",),
    "vote": _PROBLEM,
    "aggregate": (*_PROBLEM, "solutions", "n"),
    "propose": (*_PROBLEM, "max_subtasks", "strategy_format"),
    "work": (*_PROBLEM, "strategy"),
    "synthesize": (*_PROBLEM, "solutions", "n"),
    "solution_block": ("index", "solution"),
    "strategy_solution_block": ("index", "strategy", "solution"),
    "solutions_separator": (),
    "fallback_strategy": (),
}
# Variables a template must use, or the role never sees what it works on.
_REQUIRED = {
    "solve": [_PROBLEM],
    "vote": [_PROBLEM],
    "aggregate": [_PROBLEM, ("solutions",)],
    "propose": [_PROBLEM],
    "work": [_PROBLEM, ("strategy",)],
    "synthesize": [_PROBLEM, ("solutions",)],
    "solution_block": [("solution",)],
    "strategy_solution_block": [("solution",)],
}
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w+)\}")


def uses(template: str, variable: str) -> bool:
    """Whether ``template`` has the placeholder ``{variable}`` (an escaped ``{{variable}}`` does not count)."""
    return any(match.group(1) == variable for match in _PLACEHOLDER.finditer(template))


def fill(template: str, variables: tuple[str, ...], values: dict[str, Any]) -> str:
    """``template`` with its placeholders replaced, ``{{``/``}}`` unescaped, any other ``{...}`` kept as written."""

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)[0]
        return str(values[name]) if name in variables else match.group(0)

    return _PLACEHOLDER.sub(replace, template)


@dataclass(frozen=True)
class PromptSet:
    """The request templates of every role of the built-in workflows, for one task (see the module docstring).

    Args:
        solve: the generator's first request (Eval-Opt; ``SingleAgent(template="generator")``).
        evaluate: the evaluator's request.
        refine: the generator's request after a rejected attempt.
        vote: each voter's request (Voting).
        aggregate: the aggregator's request.
        propose: the orchestrator's request.
        work: each worker's request.
        synthesize: the synthesizer's request.
        solution_block: one candidate in an aggregator's ``{solutions}``.
        strategy_solution_block: one worker's solution, under a header naming its strategy, in ``{solutions}``.
        solutions_separator: the text between two blocks in ``{solutions}`` (the blocks carry their own newlines in
            the default, reference layout; the guarded set puts a blank line between blocks without them).
        fallback_strategy: the strategy given to a worker left without one under ``OrchWorkers(workers="fixed")``.
    """

    solve: str
    evaluate: str
    refine: str
    vote: str
    aggregate: str
    propose: str
    work: str
    synthesize: str
    solution_block: str = "\n--- Solution {index} ---\n{solution}\n"
    strategy_solution_block: str = "\n--- Solution {index} (Strategy: {strategy}) ---\n{solution}\n"
    solutions_separator: str = ""
    fallback_strategy: str = "No strategy was assigned; use the approach you find most reliable."

    def __post_init__(self) -> None:
        for name, groups in _REQUIRED.items():
            template = getattr(self, name)
            if not isinstance(template, str):
                raise TypeError(f"PromptSet.{name} must be a string template, got {type(template).__name__}.")
            for group in groups:
                if not any(uses(template, variable) for variable in group):
                    options = " or ".join(f"{{{variable}}}" for variable in group)
                    raise ValueError(f"The {name!r} prompt template must contain {options}: {template[:200]!r}")

    def render(self, name: str, **values: Any) -> str:
        """The text of template ``name`` with ``values`` filled in."""
        return fill(getattr(self, name), VARIABLES[name], values)

    def solutions(self, solutions: list[str], strategies: list[str] | None = None) -> str:
        """The ``{solutions}`` text: one block per candidate (with its strategy when given), joined by
        ``solutions_separator``."""
        if strategies is None:
            blocks = [self.render("solution_block", index=i + 1, solution=s) for i, s in enumerate(solutions)]
        else:
            blocks = [
                self.render("strategy_solution_block", index=i + 1, strategy=strategy, solution=solution)
                for i, (strategy, solution) in enumerate(zip(strategies, solutions, strict=True))
            ]
        return self.solutions_separator.join(blocks)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, templates: dict[str, str]) -> PromptSet:
        missing = [f.name for f in fields(cls) if f.name in FILE_KEYS and f.name not in templates]
        if missing:
            raise ValueError(f"The prompt set has no {missing[0]!r} template; it needs {list(FILE_KEYS)}.")
        if "solution_block" in templates and "solutions_separator" not in templates:
            # A record (``to_dict``, saved with checkpoints) from before the separator existed: its blocks were
            # joined by a blank line, so it rebuilds the requests it was trained on.
            templates = {**templates, "solutions_separator": "\n\n"}
        return cls(**templates)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> PromptSet:
        """Read a prompt file laid out like the reference's ``prompt.json`` (see the module docstring)."""
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a prompt file holds a JSON object of sections, got {type(data).__name__}.")
        templates = {}
        for name, (section, key) in FILE_KEYS.items():
            found = data.get(section, data.get(f"deepcoder_{section}"))
            if not isinstance(found, dict) or key not in found:
                where = f"{section!r} (or 'deepcoder_{section}')" if found is None else repr(section)
                raise ValueError(
                    f"{path}: no {key!r} prompt in section {where}; a prompt file needs "
                    + ", ".join(f"{s}.{k}" for s, k in FILE_KEYS.values())
                    + "."
                )
            templates[name] = _template(found[key], f"{path}: {section}.{key}")
        for name, value in (data.get(OPTIONAL_SECTION) or {}).items():
            if name not in VARIABLES or name in FILE_KEYS:
                optional = ("solution_block", "strategy_solution_block", "solutions_separator", "fallback_strategy")
                raise ValueError(f"{path}: unknown key {OPTIONAL_SECTION}.{name}; it may hold {optional}.")
            templates[name] = _template(value, f"{path}: {OPTIONAL_SECTION}.{name}")
        return cls(**templates)


def _template(value: Any, where: str) -> str:
    if isinstance(value, dict):
        value = value.get("template")
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a text or an object with a 'template' text.")
    return value
