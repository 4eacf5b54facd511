"""Workflow logic against a scripted fake ``generate``: no model, no torch."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from trl_multiagent import workflows
from trl_multiagent.common.parse_rules import parse_selection, parse_strategies, parse_verdict, read_strategies
from trl_multiagent.tasks.math import MATH_INSTRUCTION, math_prompt
from trl_multiagent.workflows import (
    PROMPT_SETS,
    EvalOpt,
    Generate,
    Messages,
    OrchWorkers,
    PromptSet,
    SingleAgent,
    Voting,
    Workflow,
    last_boxed,
    last_code_block,
    problem_text,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"

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
        ("\\boxed{3} and a cut-off \\boxed{\\frac{1}{", None),  # the answer was never finished
        ("no box here", None),
        ("\\boxed{}", ""),
        ("\\fbox{6}", "6"),
        ("so \\boxed 5.", "5."),
        ("<think>maybe \\boxed{4}</think> it is \\boxed{5}", "5"),
        ("<think>only \\boxed{4}</think> no box after thinking", None),
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
        ("<think>\\boxed{Correct}</think> \\boxed{Incorrect}", False),
        ("\\fbox{Correct}", True),
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
        ("```\nprint(1)\n```", "print(1)"),  # untagged: the code reward runs it
        ("```cpp\nint main() {}\n```", None),
        ("<think>```python\nprint(0)\n```</think>no code after thinking", None),
        ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)"),  # cut-off last block is ignored
        ("no code", None),
    ],
)
def test_last_code_block(text, expected):
    assert last_code_block(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("STRATEGY 1: a\nSTRATEGY 2: b", ["a", "b"]),  # headers first
        ("Plan:\n1. factor it\n2) substitute\n   then simplify", ["factor it", "substitute\n   then simplify"]),
        ("- try algebra\n\n- try a picture\n", ["try algebra", "try a picture"]),  # lines
        ("a\nb\nc\nd", ["a", "b", "c"]),  # at most n
        ("   ", [""]),  # nothing at all: one empty strategy (the whole text)
        ("<think>STRATEGY 1: hidden</think>1. shown", ["shown"]),
    ],
)
def test_read_strategies_fallbacks(text, expected):
    assert read_strategies(text, 3) == expected


def roles_of(messages: Messages) -> list[str]:
    return [message["role"] for message in messages]


# ----- Eval-Opt -----


def test_eval_opt_shared_history_is_one_conversation():
    """Three rejected attempts: the conversation keeps the first request and every output; each evaluate or refine
    request is the last turn of its own call only (the message lists against the reference: test_eval_opt_history)."""
    fake = FakeGenerate(
        {"generator": ["attempt 1", "attempt 2", "attempt 3"], "evaluator": ["bad 1", "bad 2", "bad 3"]}
    )
    assert run(EvalOpt(max_iterations=3), fake) == "attempt 3"
    assert fake.sequence == [("generator", 0), ("evaluator", 0)] * 3
    calls = [messages for _, _, messages in fake.calls]
    assert [roles_of(m) for m in calls] == [["user"]] + [["user"] + ["assistant"] * k + ["user"] for k in range(1, 6)]
    last = calls[-1]
    assert [m["content"] for m in last[1:-1]] == ["attempt 1", "bad 1", "attempt 2", "bad 2", "attempt 3"]
    for k, messages in enumerate(calls[1:], start=1):  # each call's history extends the previous call's
        assert messages[: len(calls[k - 1]) - 1] == calls[k - 1][:-1]
    solve, evaluate, refine = last[0]["content"], last[-1]["content"], calls[-2][-1]["content"]
    assert "What is 2 + 3?" in solve and "\\boxed{}" in solve
    assert [m[-1]["content"] for m in calls[1::2]] == [evaluate] * 3  # the same requests each round
    assert [m[-1]["content"] for m in calls[2::2]] == [refine] * 2
    assert "\\boxed{Correct}" in evaluate and "What is 2 + 3?" not in evaluate  # the attempt is the turn above
    assert "different approach" in refine


def test_eval_opt_shared_history_stops_at_correct():
    fake = FakeGenerate(
        {"generator": ["attempt 1", "attempt 2"], "evaluator": ["\\boxed{Incorrect}", "\\boxed{Correct}"]}
    )
    assert run(EvalOpt(max_iterations=3), fake) == "attempt 2"
    assert [len(messages) for _, _, messages in fake.calls] == [1, 3, 4, 5]


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


@pytest.mark.parametrize("history", ["shared", "fresh"])
@pytest.mark.parametrize("verdict", ["\\boxed{Incorrect}", "I am not sure.", "\\boxed{42}"])
@pytest.mark.parametrize("max_iterations", [1, 2, 3])
def test_eval_opt_runs_to_max_iterations_unless_correct(verdict, max_iterations, history):
    attempts = [f"attempt {i}" for i in range(1, max_iterations + 1)]
    fake = FakeGenerate({"generator": list(attempts), "evaluator": [verdict] * max_iterations})
    workflow = EvalOpt(max_iterations=max_iterations, history=history, prompts="guarded")
    assert run(workflow, fake) == attempts[-1]  # even though judged wrong
    assert fake.sequence == [("generator", 0), ("evaluator", 0)] * max_iterations


def test_eval_opt_fresh_history_messages():
    fake = FakeGenerate(
        {"generator": ["attempt 1", "attempt 2", "attempt 3"], "evaluator": ["step 2 is off \\boxed{Incorrect}"] * 3}
    )
    run(EvalOpt(history="fresh", prompts="guarded"), fake)
    assert [roles_of(messages) for _, _, messages in fake.calls] == [
        ["user"],
        ["user"],
        ["user", "assistant", "user"],
        ["user"],
        ["user", "assistant", "user"],
        ["user"],
    ]
    generator_calls = [messages for role, _, messages in fake.calls if role == "generator"]
    first, second, third = generator_calls
    assert len(first) == 1 and "What is 2 + 3?" in first[0]["content"] and "\\boxed{}" in first[0]["content"]
    # A refinement sees the original request, its latest attempt, and the critique; older attempts are dropped.
    assert second[0] == first[0] and second[1]["content"] == "attempt 1"
    assert "step 2 is off" in second[2]["content"] and "different approach" in second[2]["content"]
    assert third[1]["content"] == "attempt 2" and len(third) == 3
    # The evaluator gets one fresh message holding the problem and the attempt under review.
    evaluator_calls = [messages for role, _, messages in fake.calls if role == "evaluator"]
    assert "What is 2 + 3?" in evaluator_calls[1][0]["content"] and "attempt 2" in evaluator_calls[1][0]["content"]
    assert "\\boxed{Correct}" in evaluator_calls[0][0]["content"]


def test_eval_opt_fresh_history_needs_self_contained_prompts():
    with pytest.raises(ValueError, match=r"\{solution\}"):
        EvalOpt(history="fresh", prompts="paper")


# ----- Voting -----


@pytest.mark.parametrize("prompts", ["paper", "guarded"])
def test_voting_selects_the_boxed_candidate(prompts):
    fake = FakeGenerate({"generator": lambda i, _: f"voter {i} says \\boxed{{{i}}}", "aggregator": ["\\boxed{2}"]})
    assert run(Voting(prompts=prompts), fake) == "voter 1 says \\boxed{1}"
    assert fake.sequence == [("generator", 0), ("generator", 1), ("generator", 2), ("aggregator", 0)]
    assert [roles_of(messages) for _, _, messages in fake.calls] == [["user"]] * 4
    assert fake.max_in_flight == 3  # the voters run concurrently
    voter_requests = fake.texts("generator")
    assert len(set(voter_requests)) == 1 and "What is 2 + 3?" in voter_requests[0]
    (aggregator_request,) = fake.texts("aggregator")
    for i in range(3):
        assert f"--- Solution {i + 1} ---\nvoter {i} says" in aggregator_request


@pytest.mark.parametrize(
    ("parsing", "aggregator_reply", "chosen_voter"),
    [
        ("robust", "\\boxed{3}", 2),
        ("robust", "Solution 2 looks best.", 1),  # no box: first digit
        ("robust", "\\boxed{9}, I mean solution 3", 2),  # box out of range: first digit in range
        ("robust", "They all look fine.", 0),  # nothing parseable: first candidate
        ("robust", "Solution 1 says \\boxed{3}; I pick \\boxed{1}", 0),  # the last box in range
        ("reference", "\\boxed{3}", 2),
        ("reference", "Solution 2 looks best.", 1),  # no box: first digit
        ("reference", "\\boxed{9}, I mean solution 3", 0),  # box out of range, first digit (9) too: first candidate
        ("reference", "They all look fine.", 0),
        ("reference", "Solution 1 says \\boxed{3}; I pick \\boxed{1}", 2),  # the first box
    ],
)
def test_voting_selection_fallbacks(parsing, aggregator_reply, chosen_voter):
    fake = FakeGenerate({"generator": lambda i, _: f"voter {i}", "aggregator": [aggregator_reply]})
    assert run(Voting(parsing=parsing), fake) == f"voter {chosen_voter}"


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
    assert [roles_of(messages) for _, _, messages in fake.calls] == [["user"]] * 5
    assert fake.max_in_flight == 3  # the workers run concurrently
    (orchestrator_request,) = fake.texts("orchestrator")
    assert "STRATEGY 3:" in orchestrator_request and "at most 3" in orchestrator_request
    worker_requests = fake.texts("worker")
    for request, strategy in zip(worker_requests, ["direct addition", "count on fingers", "use a number line"]):
        assert strategy in request and "What is 2 + 3?" in request
    (synthesizer_request,) = fake.texts("synthesizer")
    assert "\n--- Solution 3 (Strategy: use a number line) ---\nworker 2 \\boxed{5}\n" in synthesizer_request


@pytest.mark.parametrize(
    ("plan", "strategies"),
    [
        ("STRATEGY 1: direct addition\nSTRATEGY 2: count up", ["direct addition", "count up"]),
        ("Two ideas:\n1. direct addition\n2. count up", ["direct addition", "count up"]),  # numbered list
        ("add the numbers\ncount up from 2", ["add the numbers", "count up from 2"]),  # lines
        ("I would just add them", ["I would just add them"]),  # the whole text (one line)
        ("", [""]),  # nothing: one worker with the empty plan, as the reference does
    ],
)
def test_orch_workers_runs_one_worker_per_strategy(plan, strategies):
    fake = FakeGenerate({"orchestrator": [plan], "worker": lambda i, _: f"worker {i}", "synthesizer": ["final"]})
    assert run(OrchWorkers(n_workers=3), fake) == "final"
    assert fake.sequence == [("orchestrator", 0), *(("worker", i) for i in range(len(strategies))), ("synthesizer", 0)]
    for request, strategy in zip(fake.texts("worker"), strategies):
        assert f"Strategy:\n{strategy}" in request
    (synthesizer_request,) = fake.texts("synthesizer")
    for i, strategy in enumerate(strategies):
        assert f"\n--- Solution {i + 1} (Strategy: {strategy}) ---\nworker {i}\n" in synthesizer_request


@pytest.mark.parametrize(("plan", "n_parsed"), [("STRATEGY 1: direct addition", 1), ("I would just add them: 5.", 0)])
def test_orch_workers_fixed_fills_missing_strategies(plan, n_parsed):
    fake = FakeGenerate({"orchestrator": [plan], "worker": lambda i, _: f"worker {i}", "synthesizer": ["final"]})
    workflow = OrchWorkers(n_workers=3, workers="fixed")
    assert run(workflow, fake) == "final"
    worker_requests = fake.texts("worker")
    assert len(worker_requests) == 3  # every episode has the same shape
    uses_fallback = [workflow._prompts.fallback_strategy in request for request in worker_requests]
    assert uses_fallback == [False] * n_parsed + [True] * (3 - n_parsed)


@pytest.mark.parametrize("workers", ["per_strategy", "fixed"])
def test_orch_workers_ignores_extra_strategies(workers):
    plan = "\n".join(f"STRATEGY {k}: idea {k}" for k in range(1, 6))
    fake = FakeGenerate({"orchestrator": [plan], "worker": lambda i, _: "w", "synthesizer": ["final"]})
    run(OrchWorkers(n_workers=2, workers=workers), fake)
    assert fake.sequence == [("orchestrator", 0), ("worker", 0), ("worker", 1), ("synthesizer", 0)]


# ----- Single agent -----


def test_single_agent_raw_passes_the_prompt_unchanged():
    fake = FakeGenerate({"generator": ["\\boxed{5}"]})
    assert run(SingleAgent(template="raw"), fake) == "\\boxed{5}"
    assert fake.sequence == [("generator", 0)]
    assert fake.calls[0][2] is PROMPT
    assert PROMPT == [{"role": "system", "content": "Be concise."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.mark.parametrize("prompts", ["paper", "guarded"])
def test_single_agent_generator_template_is_the_workflows_first_request(prompts):
    fake = FakeGenerate({"generator": ["\\boxed{5}"]})
    assert run(SingleAgent(prompts=prompts), fake) == "\\boxed{5}"
    ((_, _, messages),) = fake.calls
    eval_opt = FakeGenerate({"generator": ["a"], "evaluator": ["\\boxed{Correct}"]})
    run(EvalOpt(prompts=prompts, history="fresh" if prompts == "guarded" else "shared"), eval_opt)
    voting = FakeGenerate({"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]})
    run(Voting(prompts=prompts), voting)
    assert messages == eval_opt.calls[0][2] == voting.calls[0][2]
    assert roles_of(messages) == ["user"]


# ----- what the roles see -----


def test_toy_preset_reproduces_the_earlier_workflows_word_for_word():
    """The toy model was trained on these exact requests: prompts='guarded', history='fresh', workers='fixed' and
    template='raw' must give every call the messages the workflows gave before prompt sets existed (recorded in
    tests/fixtures/workflow_messages_before.json by the earlier code on the same script)."""
    recorded = json.loads((FIXTURES / "workflow_messages_before.json").read_text())
    prompts = {
        "math": math_prompt("Ann has 2 {apples}. Then she gets 3 more. How many?"),
        "code": [{"role": "user", "content": "Print 5.\n\nWrite a complete Python program that reads stdin."}],
    }
    for task in ("math", "code"):
        box = "\\boxed{5}" if task == "math" else "```python\nprint(5)\n```"
        workflows_ = {
            "eval_opt": EvalOpt(max_iterations=3, task=task, history="fresh", prompts="guarded"),
            "voting": Voting(task=task, prompts="guarded"),
            "orch_workers": OrchWorkers(task=task, workers="fixed", prompts="guarded"),
            "single_agent": SingleAgent(task=task, template="raw", prompts="guarded"),
        }
        for name, workflow in workflows_.items():

            def reply(role, instance, box=box):
                count = sum(r == role for r, _, _ in fake.calls)  # noqa: B023 - this iteration's fake; the count then
                return {
                    "generator": f"attempt {count} by {instance} {box}",
                    "evaluator": "step 2 is off \\boxed{Incorrect}",
                    "aggregator": "\\boxed{2}",
                    "orchestrator": "STRATEGY 1: add\nSTRATEGY 2: count {up}\n",
                    "worker": f"worker {instance} {box}",
                    "synthesizer": f"final {box}",
                }[role]

            fake = FakeGenerate({role: (lambda i, m, role=role: reply(role, i)) for role in workflow.roles})
            final = run(workflow, fake, prompts[task])
            expected = recorded[f"{name}/{task}"]
            assert final == expected["final"], (name, task)
            got = [
                {
                    "role": role,
                    "instance": instance,
                    "messages": [{k: m[k] for k in ("role", "content")} for m in msgs],
                }
                for role, instance, msgs in fake.calls
            ]
            assert got == expected["calls"], (name, task)


@pytest.mark.parametrize("prompts", ["paper", "guarded"])
def test_judges_get_the_problem_without_the_solvers_instruction(prompts):
    prompt = math_prompt("What is 2 + 3?")
    scripts = {
        "eval_opt": {"generator": ["a \\boxed{4}", "b \\boxed{5}"], "evaluator": ["\\boxed{Incorrect}", "ok"]},
        "voting": {"generator": lambda i, _: "\\boxed{5}", "aggregator": ["\\boxed{1}"]},
        "orch_workers": {
            "orchestrator": ["STRATEGY 1: add"],
            "worker": lambda i, _: "\\boxed{5}",
            "synthesizer": ["\\boxed{5}"],
        },
    }
    workflows_ = {
        "eval_opt": EvalOpt(max_iterations=2, prompts=prompts, history="fresh" if prompts == "guarded" else "shared"),
        "voting": Voting(prompts=prompts),
        "orch_workers": OrchWorkers(prompts=prompts),
    }
    for name, workflow in workflows_.items():
        fake = FakeGenerate(scripts[name])
        run(workflow, fake, prompt)
        for role, _, messages in fake.calls:
            text = "\n".join(message["content"] for message in messages)
            assert "What is 2 + 3?" in text, (name, role)
            if prompts == "paper":  # the guarded set is the earlier wording: the whole user message
                assert MATH_INSTRUCTION not in text, (name, role)


# ----- prompt sets -----

FILE_TEMPLATES = {
    "evaluator_optimizer_prompts": {
        "generator_initial": "SOLVE {problem}",
        "evaluator_critique": "EVALUATE {problem} / {solution} as \\boxed{Correct} or \\boxed{{Incorrect}}",
        "generator_refinement": "REFINE after {feedback}",
    },
    "voting_prompts": {"generator": "VOTE {problem}", "aggregator": "AGGREGATE {problem}\n{solutions}\nof {n}"},
    "orchestrator_workers_prompts": {
        "orchestrator_propose": "PROPOSE {max_subtasks} for {problem}",
        "worker_full_solve": "WORK {problem} with {strategy}",
        "orchestrator_compare": "SYNTHESIZE {problem}\n{solutions}",
    },
}


def write_prompt_file(path: Path, drop: tuple[str, str] | None = None, prefix: str = "") -> Path:
    """A prompt file in the reference's prompt.json layout (descriptions and metadata included, as there)."""
    data = {"metadata": {"version": "test"}}
    for section, templates in FILE_TEMPLATES.items():
        data[prefix + section] = {
            key: {"template": text, "description": "test", "required_variables": []}
            for key, text in templates.items()
            if (section, key) != drop
        }
    path.write_text(json.dumps(data))
    return path


def test_a_prompt_file_sets_every_roles_request(tmp_path):
    path = str(write_prompt_file(tmp_path / "prompt.json"))
    expected = {
        "generator": ("SOLVE What is 2 + 3?", "REFINE after bad"),
        "evaluator": ("EVALUATE What is 2 + 3? / attempt 1 as \\boxed{Correct} or \\boxed{Incorrect}",),
    }
    for history in ("shared", "fresh"):
        fake = FakeGenerate({"generator": ["attempt 1", "attempt 2"], "evaluator": ["bad", "\\boxed{Correct}"]})
        run(EvalOpt(history=history, prompts=path), fake)
        assert fake.texts("generator") == list(expected["generator"])
        assert fake.texts("evaluator")[0] == expected["evaluator"][0]
    fake = FakeGenerate({"generator": lambda i, _: f"v{i}", "aggregator": ["\\boxed{2}"]})
    assert run(Voting(n_voters=2, prompts=path), fake) == "v1"
    assert fake.texts("generator") == ["VOTE What is 2 + 3?"] * 2
    assert fake.texts("aggregator") == [
        "AGGREGATE What is 2 + 3?\n\n--- Solution 1 ---\nv0\n\n--- Solution 2 ---\nv1\n\nof 2"
    ]
    fake = FakeGenerate({"orchestrator": ["STRATEGY 1: add"], "worker": lambda i, _: "w", "synthesizer": ["s"]})
    run(OrchWorkers(prompts=path), fake)
    assert fake.texts("orchestrator") == ["PROPOSE 3 for What is 2 + 3?"]
    assert fake.texts("worker") == ["WORK What is 2 + 3? with add"]
    assert fake.texts("synthesizer") == ["SYNTHESIZE What is 2 + 3?\n\n--- Solution 1 (Strategy: add) ---\nw\n"]
    fake = FakeGenerate({"generator": ["g"]})
    run(SingleAgent(prompts=path), fake)
    assert fake.texts("generator") == ["SOLVE What is 2 + 3?"]


def test_a_prompt_file_with_the_deepcoder_section_names_loads(tmp_path):
    path = write_prompt_file(tmp_path / "prompt.json", prefix="deepcoder_")
    assert PromptSet.from_json(path) == PromptSet.from_json(write_prompt_file(tmp_path / "plain.json"))


@pytest.mark.parametrize("missing", [(s, k) for s, keys in FILE_TEMPLATES.items() for k in keys])
def test_a_prompt_file_missing_a_key_fails_naming_it(tmp_path, missing):
    path = str(write_prompt_file(tmp_path / "prompt.json", drop=missing))
    with pytest.raises(ValueError, match=f"no {missing[1]!r} prompt in section {missing[0]!r}"):
        Voting(prompts=path)


def test_a_template_without_the_problem_fails():
    with pytest.raises(ValueError, match=r"'vote' prompt template must contain \{problem\} or \{request\}"):
        PromptSet(**{**PROMPT_SETS["paper"]["math"].to_dict(), "vote": "Solve it."})


def test_templates_fill_placeholders_once():
    prompt_set = PROMPT_SETS["paper"]["math"]
    text = prompt_set.render("vote", problem="Is {solution} or {{x}} in \\boxed{4}?", request="")
    assert "Is {solution} or {{x}} in \\boxed{4}?" in text  # values are never parsed as templates


@pytest.mark.parametrize("name", sorted(PROMPT_SETS))
def test_built_in_sets_cover_both_tasks(name):
    for task in ("math", "code"):
        prompt_set = PROMPT_SETS[name][task]
        assert "\\boxed{Correct}" in prompt_set.render("evaluate", problem="p", request="p", solution="s")
        assert "STRATEGY 1: <strategy>" in prompt_set.render(
            "propose", problem="p", request="p", max_subtasks=3, strategy_format="STRATEGY 1: <strategy>"
        )


def test_the_paper_set_adds_no_guards():
    """The reference's judges are not told to stay away from solving; the guarded set keeps those lines."""
    for task in ("math", "code"):
        paper, guarded = PROMPT_SETS["paper"][task], PROMPT_SETS["guarded"][task]
        for name in ("evaluate", "aggregate", "synthesize"):
            assert "yourself" not in getattr(paper, name) and "of your own" not in getattr(paper, name)
        assert "Do not solve the problem yourself" in guarded.evaluate
        assert "Do not write a solution of your own" in guarded.aggregate


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


@pytest.mark.parametrize("prompts", ["paper", "guarded"])
@pytest.mark.parametrize(
    ("build", "script"),
    [
        (
            lambda p: EvalOpt(
                max_iterations=2, task="code", prompts=p, history="fresh" if p == "guarded" else "shared"
            ),
            {"generator": ["a", "b"], "evaluator": ["\\boxed{Incorrect}"] * 2},
        ),
        (lambda p: Voting(task="code", prompts=p), {"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]}),
        (
            lambda p: OrchWorkers(task="code", prompts=p),
            {"orchestrator": ["STRATEGY 1: loop"], "worker": lambda i, _: "a", "synthesizer": ["a"]},
        ),
    ],
)
def test_code_prompts_defer_to_the_form_the_problem_asks_for(build, script, prompts):
    """DeepCoder function-call rows ask for a function: no role may be told to write a stdin/stdout program."""
    fake = FakeGenerate(script)
    run(build(prompts), fake, FUNCTION_PROBLEM)
    for role, _, messages in fake.calls:
        request = messages[-1]["content"]
        assert "Python function `total`" in messages[0]["content"], role  # the row's own instruction is kept
        assert "must read" not in request, role
        if prompts == "guarded":
            assert role == "orchestrator" or "the form the problem asks for" in request, role  # it writes no code
    math = FakeGenerate({"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]})
    code = FakeGenerate({"generator": lambda i, _: "a", "aggregator": ["\\boxed{1}"]})
    run(Voting(task="math", prompts=prompts), math)
    run(Voting(task="code", prompts=prompts), code)
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
        (lambda: SingleAgent(task="coding"), "'math', 'code'"),
        (lambda: EvalOpt(history="private"), "'shared', 'fresh'"),
        (lambda: EvalOpt(parsing="first"), "'reference', 'robust'"),
        (lambda: Voting(parsing="last"), "'reference', 'robust'"),
        (lambda: OrchWorkers(parsing="strict"), "'reference', 'robust'"),
        (lambda: OrchWorkers(workers="three"), "'per_strategy', 'fixed'"),
        (lambda: SingleAgent(template="chat"), "'generator', 'raw'"),
        (lambda: Voting(prompts="polite"), "'guarded', 'paper'"),
    ],
)
def test_bad_parameters_raise(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_config_dict_rebuilds_the_workflow(tmp_path):
    assert EvalOpt(max_iterations=2, task="code").config_dict() == {
        "workflow": "EvalOpt",
        "max_iterations": 2,
        "task": "code",
        "history": "shared",
        "parsing": "reference",
        "prompts": "paper",
    }
    assert Voting().config_dict() == {
        "workflow": "Voting",
        "n_voters": 3,
        "task": "math",
        "parsing": "reference",
        "prompts": "paper",
    }
    assert OrchWorkers(n_workers=2, workers="fixed", prompts="guarded", parsing="robust").config_dict() == {
        "workflow": "OrchWorkers",
        "n_workers": 2,
        "task": "math",
        "workers": "fixed",
        "parsing": "robust",
        "prompts": "guarded",
    }
    assert SingleAgent(template="raw").config_dict() == {
        "workflow": "SingleAgent",
        "task": "math",
        "template": "raw",
        "prompts": "paper",
    }
    # A prompt file is recorded by its templates, so a checkpoint rebuilds the workflow without the file.
    path = write_prompt_file(tmp_path / "prompt.json")
    config = Voting(prompts=str(path)).config_dict()
    assert config["prompts"]["vote"] == "VOTE {problem}"
    rebuilt = Voting(**{k: v for k, v in config.items() if k != "workflow"})
    assert rebuilt.config_dict() == config and rebuilt._prompts == Voting(prompts=str(path))._prompts


@pytest.mark.parametrize("workflow", [EvalOpt(), Voting(), OrchWorkers(), SingleAgent()])
def test_workflows_only_call_their_declared_roles(workflow):
    fake = FakeGenerate({role: (lambda i, _: "\\boxed{Correct} \\boxed{1}") for role in workflow.roles})
    run(workflow, fake)
    assert {role for role, _ in fake.sequence} == set(workflow.roles)


def test_parallel_roles_declare_their_most_instances():
    assert Voting(n_voters=4).parallel == {"generator": 4}
    assert OrchWorkers(n_workers=2).parallel == {"worker": 2}
    assert EvalOpt().parallel == {} and SingleAgent().parallel == {}
    assert "parallel" not in Voting().config_dict()


def test_workflows_import_no_models():
    """Workflows must stay importable and testable without torch, and independent of the package's other folders."""
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
