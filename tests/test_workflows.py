"""Workflow logic against a scripted fake ``generate``: no model, no torch."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from trl_multiagent import workflows
from trl_multiagent.workflows import (
    EvalOpt,
    Generate,
    Messages,
    OrchWorkers,
    SingleAgent,
    Voting,
    Workflow,
    last_boxed,
    last_code_block,
    parse_selection,
    parse_strategies,
    parse_verdict,
    problem_text,
)
from trl_multiagent.workflows.prompts import FALLBACK_STRATEGY

PROMPT = [{"role": "system", "content": "Be concise."}, {"role": "user", "content": "What is 2 + 3?"}]


class FakeGenerate:
    """Records every call as ``(role, instance, messages)`` and answers from a script.

    ``script[role]`` is either a list of replies consumed in call order or a function ``(instance, messages) -> str``.
    """

    def __init__(self, script: dict[str, list[str] | Callable[[int, Messages], str]]):
        self.script = {role: list(r) if isinstance(r, list) else r for role, r in script.items()}
        self.calls: list[tuple[str, int, Messages]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, role: str, messages: Messages, *, instance: int = 0) -> str:
        self.calls.append((role, instance, messages))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)  # yield, as a real backend would, so concurrent calls overlap
        self.in_flight -= 1
        reply = self.script[role]
        return reply(instance, messages) if callable(reply) else reply.pop(0)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        return [(role, instance) for role, instance, _ in self.calls]

    def texts(self, role: str) -> list[str]:
        """The last message of each call of ``role``: the request the workflow wrote for it."""
        return [messages[-1]["content"] for r, _, messages in self.calls if r == role]


def run(workflow: Workflow, generate: FakeGenerate, prompt: Messages = PROMPT) -> str:
    return asyncio.run(workflow.run(prompt, generate))


# ----- parsers -----


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{5}.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed {7}", "7"),
        ("\\boxed{3} and a cut-off \\boxed{\\frac{1}{", "3"),
        ("no box here", None),
        ("\\boxed{}", ""),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Looks right. \\boxed{Correct}", True),
        ("Step 2 is wrong. \\boxed{Incorrect}", False),
        ("\\boxed{correct}", True),
        ("\\boxed{INCORRECT}", False),
        ("\\boxed{\\text{Correct.}}", True),
        ("At first \\boxed{Correct}, but on reflection \\boxed{Incorrect}", False),
        ("\\boxed{Incorrect} ... no wait, \\boxed{Correct}", True),
        ("\\boxed{Incorrect}; the answer should be \\boxed{42}", False),
        ("It is correct.", None),
        ("\\boxed{maybe}", None),
        ("", None),
    ],
)
def test_parse_verdict(text, expected):
    assert parse_verdict(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Solution 2 is right. \\boxed{2}", (1, True)),
        ("\\boxed{3}", (2, True)),
        ("\\boxed{\\text{Solution 1}}", (0, True)),
        ("Solution 1 says \\boxed{5}; I pick \\boxed{3}", (2, True)),  # last box in range wins
        ("Solution 1 says \\boxed{42}", (0, False)),  # box out of range: first digit fallback
        ("I choose solution 3, not 1.", (2, False)),  # no box: first digit 1-9
        ("Solutions 7 and 2 are close; 2 wins.", (1, False)),  # digits above n are skipped
        ("The year 2024 matters.", (0, False)),  # digits inside numbers are not picks
        ("I cannot decide.", (0, False)),  # nothing: candidate 0
    ],
)
def test_parse_selection(text, expected):
    assert parse_selection(text, 3) == expected


def test_parse_selection_needs_candidates():
    with pytest.raises(ValueError, match="at least one candidate"):
        parse_selection("\\boxed{1}", 0)


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("STRATEGY 1: algebra\nSTRATEGY 2: casework\nSTRATEGY 3: geometry", 3, ["algebra", "casework", "geometry"]),
        ("STRATEGY 1: a\nSTRATEGY 2: b\nSTRATEGY 3: c", 2, ["a", "b"]),
        ("Plan:\n**Strategy 1:** factor it\n**STRATEGY 2**: substitute", 3, ["factor it", "substitute"]),
        (
            "- STRATEGY 1: first line\n  continues here\n- STRATEGY 2: second",
            3,
            ["first line\n  continues here", "second"],
        ),
        ("strategy 1: lower case", 3, ["lower case"]),
        ("STRATEGY 1:\nSTRATEGY 2: only this one", 3, ["only this one"]),
        ("1. algebra\n2. casework", 3, []),
        ("", 3, []),
    ],
)
def test_parse_strategies(text, n, expected):
    assert parse_strategies(text, n) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)"),
        ("```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```", "print(2)"),
        ("```py\nx = 1\n```", "x = 1"),
        ("```Python3\nx = 1\n```", "x = 1"),
        ("```\nprint(1)\n```", None),
        ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)"),  # cut-off last block is ignored
        ("no code", None),
    ],
)
def test_last_code_block(text, expected):
    assert last_code_block(text) == expected


# ----- Eval-Opt -----


def test_eval_opt_stops_at_correct():
    fake = FakeGenerate(
        {"generator": ["attempt 1", "attempt 2"], "evaluator": ["bad \\boxed{Incorrect}", "\\boxed{Correct}"]}
    )
    assert run(EvalOpt(max_iterations=3), fake) == "attempt 2"
    assert fake.sequence == [("generator", 0), ("evaluator", 0)] * 2


def test_eval_opt_one_round_when_first_attempt_accepted():
    fake = FakeGenerate({"generator": ["attempt 1"], "evaluator": ["\\boxed{Correct}"]})
    assert run(EvalOpt(), fake) == "attempt 1"
    assert len(fake.calls) == 2


@pytest.mark.parametrize("verdict", ["\\boxed{Incorrect}", "I am not sure.", "\\boxed{42}"])
@pytest.mark.parametrize("max_iterations", [1, 2, 3])
def test_eval_opt_runs_to_max_iterations_unless_correct(verdict, max_iterations):
    attempts = [f"attempt {i}" for i in range(1, max_iterations + 1)]
    fake = FakeGenerate({"generator": list(attempts), "evaluator": [verdict] * max_iterations})
    assert run(EvalOpt(max_iterations=max_iterations), fake) == attempts[-1]  # even though judged wrong
    assert fake.sequence == [("generator", 0), ("evaluator", 0)] * max_iterations


def test_eval_opt_messages():
    fake = FakeGenerate(
        {"generator": ["attempt 1", "attempt 2", "attempt 3"], "evaluator": ["step 2 is off \\boxed{Incorrect}"] * 3}
    )
    run(EvalOpt(), fake)
    generator_calls = [messages for role, _, messages in fake.calls if role == "generator"]
    first, second, third = generator_calls
    assert len(first) == 1 and "What is 2 + 3?" in first[0]["content"] and "\\boxed{}" in first[0]["content"]
    # A refinement sees the original request, its latest attempt, and the critique; older attempts are dropped.
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[0] == first[0] and second[1]["content"] == "attempt 1"
    assert "step 2 is off" in second[2]["content"] and "different approach" in second[2]["content"]
    assert third[1]["content"] == "attempt 2" and len(third) == 3
    # The evaluator gets one fresh message holding the problem and the attempt under review.
    evaluator_calls = [messages for role, _, messages in fake.calls if role == "evaluator"]
    assert all(len(messages) == 1 for messages in evaluator_calls)
    assert "What is 2 + 3?" in evaluator_calls[1][0]["content"] and "attempt 2" in evaluator_calls[1][0]["content"]
    assert "\\boxed{Correct}" in evaluator_calls[0][0]["content"]


# ----- Voting -----


def test_voting_selects_the_boxed_candidate():
    fake = FakeGenerate({"generator": lambda i, _: f"voter {i} says \\boxed{{{i}}}", "aggregator": ["\\boxed{2}"]})
    assert run(Voting(), fake) == "voter 1 says \\boxed{1}"
    assert fake.sequence == [("generator", 0), ("generator", 1), ("generator", 2), ("aggregator", 0)]
    assert fake.max_in_flight == 3  # the voters run concurrently
    voter_requests = fake.texts("generator")
    assert len(set(voter_requests)) == 1 and "What is 2 + 3?" in voter_requests[0]
    (aggregator_request,) = fake.texts("aggregator")
    for i in range(3):
        assert f"--- Solution {i + 1} ---\nvoter {i} says" in aggregator_request


@pytest.mark.parametrize(
    ("aggregator_reply", "chosen_voter"),
    [
        ("\\boxed{3}", 2),
        ("Solution 2 looks best.", 1),  # no box: first digit
        ("\\boxed{9}, I mean solution 3", 2),  # box out of range: first digit in range
        ("They all look fine.", 0),  # nothing parseable: first candidate
    ],
)
def test_voting_selection_fallbacks(aggregator_reply, chosen_voter):
    fake = FakeGenerate({"generator": lambda i, _: f"voter {i}", "aggregator": [aggregator_reply]})
    assert run(Voting(), fake) == f"voter {chosen_voter}"


def test_voting_n_voters():
    fake = FakeGenerate({"generator": lambda i, _: f"voter {i}", "aggregator": ["\\boxed{5}"]})
    assert run(Voting(n_voters=5), fake) == "voter 4"
    assert [instance for role, instance in fake.sequence if role == "generator"] == [0, 1, 2, 3, 4]


# ----- Orch-Workers -----


def test_orch_workers_assigns_one_strategy_per_worker():
    plan = "STRATEGY 1: direct addition\nSTRATEGY 2: count on fingers\nSTRATEGY 3: use a number line"
    fake = FakeGenerate(
        {"orchestrator": [plan], "worker": lambda i, _: f"worker {i} \\boxed{{5}}", "synthesizer": ["\\boxed{5}"]}
    )
    assert run(OrchWorkers(), fake) == "\\boxed{5}"
    assert fake.sequence == [("orchestrator", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("synthesizer", 0)]
    assert fake.max_in_flight == 3  # the workers run concurrently
    (orchestrator_request,) = fake.texts("orchestrator")
    assert "STRATEGY 3:" in orchestrator_request and "Do not solve" in orchestrator_request
    worker_requests = fake.texts("worker")
    for request, strategy in zip(worker_requests, ["direct addition", "count on fingers", "use a number line"]):
        assert strategy in request and "What is 2 + 3?" in request
    (synthesizer_request,) = fake.texts("synthesizer")
    assert "--- Solution 3 ---\nStrategy: use a number line" in synthesizer_request
    assert "worker 2 \\boxed{5}" in synthesizer_request


@pytest.mark.parametrize(("plan", "n_parsed"), [("STRATEGY 1: direct addition", 1), ("I would just add them: 5.", 0)])
def test_orch_workers_fills_missing_strategies(plan, n_parsed):
    fake = FakeGenerate({"orchestrator": [plan], "worker": lambda i, _: f"worker {i}", "synthesizer": ["final"]})
    assert run(OrchWorkers(n_workers=3), fake) == "final"
    worker_requests = fake.texts("worker")
    assert len(worker_requests) == 3  # every episode has the same shape
    uses_fallback = [FALLBACK_STRATEGY in request for request in worker_requests]
    assert uses_fallback == [False] * n_parsed + [True] * (3 - n_parsed)


def test_orch_workers_ignores_extra_strategies():
    plan = "\n".join(f"STRATEGY {k}: idea {k}" for k in range(1, 6))
    fake = FakeGenerate({"orchestrator": [plan], "worker": lambda i, _: "w", "synthesizer": ["final"]})
    run(OrchWorkers(n_workers=2), fake)
    assert fake.sequence == [("orchestrator", 0), ("worker", 0), ("worker", 1), ("synthesizer", 0)]


# ----- Single agent -----


def test_single_agent_passes_the_prompt_unchanged():
    fake = FakeGenerate({"generator": ["\\boxed{5}"]})
    assert run(SingleAgent(), fake) == "\\boxed{5}"
    assert fake.sequence == [("generator", 0)]
    assert fake.calls[0][2] is PROMPT
    assert PROMPT == [{"role": "system", "content": "Be concise."}, {"role": "user", "content": "What is 2 + 3?"}]


# ----- tasks, parameters, contract -----


def test_code_task_prompts_ask_for_python():
    code = "```python\nprint(5)\n```"
    fake = FakeGenerate({"generator": [code, code], "evaluator": ["\\boxed{Incorrect}", "\\boxed{Correct}"]})
    run(EvalOpt(max_iterations=2, task="code"), fake)
    for request in fake.texts("generator") + fake.texts("evaluator"):
        assert "standard input" in request or "code" in request
    assert all("```python" in request and "\\boxed{}" not in request for request in fake.texts("generator"))

    fake = FakeGenerate({"generator": lambda i, _: code, "aggregator": ["\\boxed{1}"]})
    run(Voting(task="code"), fake)
    assert "```python" in fake.texts("generator")[0] and "programming problem" in fake.texts("aggregator")[0]

    fake = FakeGenerate({"orchestrator": ["STRATEGY 1: greedy"], "worker": lambda i, _: code, "synthesizer": [code]})
    assert run(OrchWorkers(task="code"), fake) == code
    assert "programming problem" in fake.texts("orchestrator")[0]
    assert all("```python" in request for request in fake.texts("worker") + fake.texts("synthesizer"))


FUNCTION_PROBLEM = [
    {
        "role": "user",
        "content": "Return the sum of a list of integers.\n\nWrite your solution as a Python function `total`: it is "
        "called with each test's arguments and its return value is checked. Give the code in a single ```python "
        "code block.",
    }
]


@pytest.mark.parametrize(
    ("workflow", "script"),
    [
        (EvalOpt(max_iterations=2, task="code"), {"generator": ["a", "b"], "evaluator": ["\\boxed{Incorrect}"] * 2}),
        (Voting(task="code"), {"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]}),
        (OrchWorkers(task="code"), {"orchestrator": ["STRATEGY 1: loop"], "worker": lambda i, _: "a",
                                    "synthesizer": ["a"]}),
    ],
)  # fmt: skip
def test_code_prompts_defer_to_the_form_the_problem_asks_for(workflow, script):
    """DeepCoder function-call rows ask for a function: no role may be told to write a stdin/stdout program."""
    fake = FakeGenerate(script)
    run(workflow, fake, FUNCTION_PROBLEM)
    for role, _, messages in fake.calls:
        request = messages[-1]["content"]
        assert "Python function `total`" in messages[0]["content"], role  # the row's own instruction is kept
        assert "must read" not in request, role
        assert role == "orchestrator" or "the form the problem asks for" in request, role  # it plans, writes no code
    math = FakeGenerate({"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]})
    code = FakeGenerate({"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]})
    run(Voting(task="math"), math)
    run(Voting(task="code"), code)
    assert "\\boxed{}" in math.texts("generator")[0] and "```python" not in math.texts("generator")[0]
    assert math.texts("generator")[0] != code.texts("generator")[0]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EvalOpt(max_iterations=0), "max_iterations >= 1"),
        (lambda: Voting(n_voters=1), "n_voters >= 2"),
        (lambda: OrchWorkers(n_workers=0), "n_workers >= 1"),
        (lambda: EvalOpt(task="poetry"), "'math', 'code'"),
        (lambda: Voting(task="Math"), "'math', 'code'"),
        (lambda: OrchWorkers(task="coding"), "'math', 'code'"),
    ],
)
def test_bad_parameters_raise(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_config_dict_rebuilds_the_workflow():
    assert EvalOpt(max_iterations=2, task="code").config_dict() == {
        "workflow": "EvalOpt",
        "max_iterations": 2,
        "task": "code",
    }
    assert Voting().config_dict() == {"workflow": "Voting", "n_voters": 3, "task": "math"}
    assert OrchWorkers(n_workers=2).config_dict() == {"workflow": "OrchWorkers", "n_workers": 2, "task": "math"}
    assert SingleAgent().config_dict() == {"workflow": "SingleAgent"}


@pytest.mark.parametrize("workflow", [EvalOpt(), Voting(), OrchWorkers(), SingleAgent()])
def test_workflows_only_call_their_declared_roles(workflow):
    fake = FakeGenerate({role: (lambda i, _: "\\boxed{Correct} \\boxed{1}") for role in workflow.roles})
    run(workflow, fake)
    assert {role for role, _ in fake.sequence} == set(workflow.roles)


def test_workflows_import_no_models():
    """Workflows must stay importable and testable without torch, and independent of the other rooms."""
    forbidden = {"torch", "transformers", "trl", "peft", "vllm", "accelerate"}
    for path in Path(workflows.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path} imports {name}"
                assert not name.startswith("trl_multiagent.") or name.startswith("trl_multiagent.workflows"), path


# ----- a user-defined workflow: the whole API a user needs -----


class DraftThenRewrite(Workflow):
    """One agent drafts; a second critiques the draft and rewrites it. The rewrite is the answer."""

    roles = ("drafter", "editor")

    def __init__(self, task_hint: str = "Put the final answer in \\boxed{}."):
        self.task_hint = task_hint

    async def run(self, prompt: Messages, generate: Generate) -> str:
        problem = problem_text(prompt)
        draft = await generate("drafter", [{"role": "user", "content": f"{problem}\n\n{self.task_hint}"}])
        request = (
            f"Problem:\n{problem}\n\nDraft solution:\n{draft}\n\n"
            f"List the draft's mistakes, then write a corrected solution. {self.task_hint}"
        )
        return await generate("editor", [{"role": "user", "content": request}])


def test_user_defined_workflow():
    fake = FakeGenerate({"drafter": ["2 + 3 = 6, \\boxed{6}"], "editor": ["The sum is wrong. \\boxed{5}"]})
    workflow = DraftThenRewrite()
    answer = run(workflow, fake)
    assert last_boxed(answer) == "5"
    assert fake.sequence == [("drafter", 0), ("editor", 0)]
    assert "\\boxed{6}" in fake.texts("editor")[0]
    assert workflow.config_dict() == {
        "workflow": "DraftThenRewrite",
        "task_hint": "Put the final answer in \\boxed{}.",
    }
