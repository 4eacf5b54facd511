r"""Eval-Opt's shared history under the paper preset is the reference's, call by call, through the rollout engine.

The reference (``rllm/workflows/evaluator_optimizer_workflow.py:268-431``, run with ``share_conversation_history=True``
by ``examples/math_reasoning/evaluator_optimizer_math_workflow.py:67`` and
``examples/deepcoder/deepcoder_evaluator_optimizer_workflow.py:104``) keeps one list: the first user turn, then each
attempt and each critique as an assistant turn. An evaluate or refine request is added as a last user turn to the
messages of the call it asks, and never to the list. ``reference_calls`` below restates that loop; each test runs
ours under the paper preset's workflow options on the scripted backend and compares every call's messages, its recorded
``ModelCall.messages`` and the prompt tokens it was rendered to.
"""

from __future__ import annotations

import pytest
from presets import workflow_options
from scripted import ScriptedBackend
from transformers import AutoTokenizer

from trl_multiagent.rollout.chat_rendering import ChatRenderer
from trl_multiagent.rollout.engine import RolloutEngine
from trl_multiagent.toy import TOY_MODEL_DIR
from trl_multiagent.workflows import EvalOpt, problem_text, request_text

PAPER = workflow_options("paper_math")
ADAPTERS = {"generator": "g", "evaluator": "e"}
MATH = [{"role": "user", "content": "What is 2 + 3?"}]
CODE = [{"role": "user", "content": "Read n from standard input and print n + 1."}]


def reference_says_correct(text: str) -> bool:
    """The reference's verdict (``evaluator_optimizer_math_workflow.py:183``): the first box reading exactly Correct or
    Incorrect, in any case, decides; without one the evaluator is not satisfied."""
    lower = text.lower()
    found = sorted((lower.find(f"\\boxed{{{word}}}"), word) for word in ("correct", "incorrect"))
    found = [(at, word) for at, word in found if at >= 0]
    return bool(found) and found[0][1] == "correct"


def reference_calls(solve: str, evaluate: str, refine: str, attempts, critiques, max_iterations: int) -> list:
    """The reference's calls ``(role, messages)`` for scripted outputs: a restatement of its ``run`` loop."""
    history = [{"role": "user", "content": solve}]
    calls = [("generator", list(history))]
    history.append({"role": "assistant", "content": attempts[0]})
    for iteration in range(max_iterations):
        calls.append(("evaluator", history + [{"role": "user", "content": evaluate}]))
        history.append({"role": "assistant", "content": critiques[iteration]})
        # should_continue (evaluator_optimizer_workflow.py:247) with the first-box verdict (..._math_workflow.py:183)
        if reference_says_correct(critiques[iteration]) or iteration >= max_iterations - 1:
            break
        calls.append(("generator", history + [{"role": "user", "content": refine}]))
        history.append({"role": "assistant", "content": attempts[iteration + 1]})
    return calls


def scripted(outputs: dict[str, list[str]]):
    """Answers each request with its adapter's next scripted output."""
    left = {ADAPTERS[role]: list(texts) for role, texts in outputs.items()}
    return lambda requests, rng: [left[request.adapter].pop(0) for request in requests]


def requests_of(workflow: EvalOpt, prompt) -> dict[str, str]:
    """The solve, evaluate and refine requests our prompt set writes for ``prompt`` (what the reference's templates
    are to it: the same text every round)."""
    values = {"problem": problem_text(prompt), "request": request_text(prompt)}
    render = workflow._prompts.render
    return {
        "solve": render("solve", **values),
        "evaluate": render("evaluate", **values, solution=""),
        "refine": render("refine", feedback=""),
    }


@pytest.fixture(scope="module", params=["tiny", "toy"])
def tokenizer(request, tiny_model_dir):
    """The tiny test model's chat template and the shipped toy model's: both must render two assistant turns."""
    return AutoTokenizer.from_pretrained(tiny_model_dir if request.param == "tiny" else TOY_MODEL_DIR)


CASES = {
    "math-three-rounds": dict(
        task="math",
        prompt=MATH,
        max_iterations=3,
        attempts=["first try \\boxed{6}", "second try \\boxed{4}", "third try \\boxed{5}"],
        # two verdict boxes: the reference reads the first, so the episode goes on
        critiques=[
            "\\boxed{Incorrect}, hmm, on reflection \\boxed{Correct}",
            "off by one \\boxed{Incorrect}",
            "\\boxed{Correct}",
        ],
    ),
    "math-accepted-second": dict(
        task="math",
        prompt=MATH,
        max_iterations=3,
        attempts=["first try \\boxed{6}", "second try \\boxed{5}"],
        critiques=["wrong sum \\boxed{Incorrect}", "\\boxed{Correct} (and not \\boxed{Incorrect})"],
    ),
    "code-two-rounds": dict(
        task="code",
        prompt=CODE,
        max_iterations=2,
        attempts=["```python\nprint(int(input()))\n```", "```python\nprint(int(input()) + 1)\n```"],
        critiques=["It forgets the + 1. \\boxed{Incorrect}", "\\boxed{Correct}"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shared_history_is_the_references(case, tokenizer):
    spec = CASES[case]
    workflow = EvalOpt(
        max_iterations=spec["max_iterations"],
        task=spec["task"],
        **{key: PAPER[key] for key in ("prompts", "history", "parsing")},
    )
    texts = requests_of(workflow, spec["prompt"])
    expected = reference_calls(
        texts["solve"], texts["evaluate"], texts["refine"], spec["attempts"], spec["critiques"], spec["max_iterations"]
    )
    backend = ScriptedBackend(tokenizer, scripted({"generator": spec["attempts"], "evaluator": spec["critiques"]}))
    (episode,) = RolloutEngine(workflow, backend, ADAPTERS).run([spec["prompt"]])

    sent = [({v: k for k, v in ADAPTERS.items()}[request.adapter], request.messages) for request in backend.requests]
    assert sent == expected
    # The engine records each call with exactly the messages it was given, rendered as given.
    assert [(call.role, call.messages) for call in episode.calls] == expected
    assert [call.prompt_ids for call in episode.calls] == [ChatRenderer(tokenizer).prompt_ids(m) for _, m in expected]
    assert episode.final_answer == spec["attempts"][sum(role == "generator" for role, _ in expected) - 1]


def test_second_and_third_calls_spelled_out(tiny_model_dir):
    """The message lists of the issue, literally: the second generator call, the second evaluator call and the third
    generator call of a three-round math episode."""
    spec = CASES["math-three-rounds"]
    workflow = EvalOpt(max_iterations=3, **{key: PAPER[key] for key in ("prompts", "history", "parsing")})
    text = requests_of(workflow, MATH)
    backend = ScriptedBackend(
        AutoTokenizer.from_pretrained(tiny_model_dir),
        scripted({"generator": spec["attempts"], "evaluator": spec["critiques"]}),
    )
    RolloutEngine(workflow, backend, ADAPTERS).run([MATH])
    generator = [request.messages for request in backend.requests if request.adapter == "g"]
    evaluator = [request.messages for request in backend.requests if request.adapter == "e"]
    (attempt_1, attempt_2, attempt_3), (critique_1, critique_2, _) = spec["attempts"], spec["critiques"]

    def turns(*pairs):
        return [{"role": role, "content": content} for role, content in pairs]

    assert generator[1] == turns(
        ("user", text["solve"]), ("assistant", attempt_1), ("assistant", critique_1), ("user", text["refine"])
    )
    assert evaluator[1] == turns(
        ("user", text["solve"]),
        ("assistant", attempt_1),
        ("assistant", critique_1),
        ("assistant", attempt_2),
        ("user", text["evaluate"]),
    )
    assert generator[2] == turns(
        ("user", text["solve"]),
        ("assistant", attempt_1),
        ("assistant", critique_1),
        ("assistant", attempt_2),
        ("assistant", critique_2),
        ("user", text["refine"]),
    )
    assert evaluator[2][-2:] == turns(("assistant", attempt_3), ("user", text["evaluate"]))


# the paper's prompts are written for the shared history (EvalOpt refuses them with the fresh one)
@pytest.mark.parametrize(("history", "prompts"), [("shared", "paper"), ("shared", "guarded"), ("fresh", "guarded")])
def test_review_request_is_what_the_evaluator_judges_first(history, prompts, tiny_model_dir):
    """``review_request`` (the judge of the judged best-of-n baseline) is, message for message, the first evaluator
    call of an episode whose first attempt is the given one, for either history."""
    workflow = EvalOpt(max_iterations=2, history=history, prompts=prompts)
    attempt = "first try \\boxed{6}"
    backend = ScriptedBackend(
        AutoTokenizer.from_pretrained(tiny_model_dir),
        scripted({"generator": [attempt], "evaluator": ["\\boxed{Correct}"]}),
    )
    (episode,) = RolloutEngine(workflow, backend, ADAPTERS).run([MATH])
    (first_review,) = [call.messages for call in episode.calls if call.role == "evaluator"]
    assert workflow.review_request(MATH, attempt) == first_review
    assert workflow.review_request(MATH, "another \\boxed{7}") != first_review  # the attempt is in it
