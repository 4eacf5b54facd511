r"""One rule per role: the workflow, the reward, the training metrics and the evaluators read every role output alike.

Each row feeds one role's declared format an edge case (``\fbox``, ``\boxed 5``, ``</think>``, untagged fences,
several verdict or selection boxes, cut-off output) and checks that every place that reads that role agrees: the
workflow's own decision, the reward's extraction, ``role/<role>/unparseable`` in ``workflow_metrics``, the evaluation
episode record and the toy evaluator. Also: the chat templates in use render the shared Eval-Opt conversation.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer

from trl_multiagent.evaluation.episodes import parse_call
from trl_multiagent.evaluation.toy import follows_format
from trl_multiagent.monitoring import workflow_metrics
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.tasks import TestCase, TestSuite, check_verdicts, extract_boxed, extract_code, math_reward
from trl_multiagent.toy import TOY_MODEL_DIR
from trl_multiagent.workflows import EvalOpt, OrchWorkers, SingleAgent, Voting

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
CUT = "\\boxed{4} and then \\boxed{\\frac{1}{"

MATH_ANSWERS = [
    ("so \\boxed{5}", "5"),
    ("\\fbox{5}", "5"),
    ("hence \\boxed 5", "5"),
    ("\\boxed{\\boxed{5}}", "5"),
    ("<think>\\boxed{4}</think> so \\boxed{5}", "5"),
    ("<think>so \\boxed{5}</think> no box after thinking", None),
    (CUT, None),  # cut off inside the last box: no answer, even though an earlier box closed
    ("\\boxed{4} first, finally \\boxed{5}", "5"),
    ("five", None),
]
CODE_ANSWERS = [
    ("```python\nprint(5)\n```", "print(5)"),
    ("```\nprint(5)\n```", "print(5)"),  # untagged: the reward runs it
    ("```py\nprint(4)\n```\n```python3\nprint(5)\n```", "print(5)"),
    ("```cpp\nint main() {}\n```", None),
    ("<think>```python\nprint(4)\n```</think>```python\nprint(5)\n```", "print(5)"),
    ("```python\nprint(4)\n```\n```python\nprint(5)", "print(4)"),  # the cut-off last block is skipped
    ("print(5)", None),
]
VERDICTS = [
    ("\\boxed{Correct}", True),
    ("\\fbox{Incorrect}", False),
    ("\\boxed Correct", True),
    ("\\boxed{Incorrect} ... on reflection \\boxed{Correct}", True),  # the last verdict wins
    ("\\boxed{Correct}, but the answer is \\boxed{42}", True),  # non-verdict boxes are skipped
    ("<think>\\boxed{Correct}</think> \\boxed{Incorrect}", False),
    ("<think>\\boxed{Correct}</think> I am unsure", None),
    ("It is correct.", None),
]
SELECTIONS = [  # three candidates
    ("\\boxed{2}", 1),
    ("\\fbox{3}", 2),
    ("Solution 1 says \\boxed{3}; I pick \\boxed{1}", 0),  # the last box in range
    ("\\boxed{Solution 2}", 1),
    ("<think>\\boxed{1}</think> \\boxed{3}", 2),
    ("\\boxed{9}", None),  # out of range: fallback
    ("Solution 2 is best", None),  # no box: fallback (first digit in range)
]
PLANS = [  # one worker per strategy
    ("STRATEGY 1: add\nSTRATEGY 2: count", ["add", "count"]),
    ("**Strategy 1:** add", ["add"]),
    ("1. add\n2. count", None),  # numbered list: a fallback
    ("just add", None),
    ("", None),
]


def call(role: str, text: str, instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [], [1], [2], text, truncated=False)


def unparseable(workflow, episode: Episode, role: str) -> float:
    return workflow_metrics(workflow, [episode], [math.nan])[f"role/{role}/unparseable"]


def agree_as_recorded(workflow, role: str, text: str, task: str, expected) -> None:
    record = parse_call(call(role, text), workflow, task)
    assert record["parsed"] == (expected is not None)
    assert follows_format(workflow, role, text) == (expected is not None)


def run(workflow, script: dict) -> tuple[str, list[str]]:
    roles = []

    async def generate(role, messages, *, instance=0):
        roles.append(role)
        reply = script[role]
        return reply(instance) if callable(reply) else reply

    return asyncio.run(workflow.run(QUESTION, generate)), roles


@pytest.mark.parametrize(("text", "expected"), MATH_ANSWERS)
def test_math_answers_read_alike(text, expected):
    for workflow, role in [(SingleAgent(), "generator"), (Voting(), "generator"), (OrchWorkers(), "synthesizer")]:
        assert workflow.formats[role].parse(text) == expected
        episode = Episode(0, [call(role, text)])
        assert unparseable(workflow, episode, role) == float(expected is None)
        agree_as_recorded(workflow, role, text, "math", expected)
    assert extract_boxed(text) == expected  # what math_reward grades
    assert math_reward([text], ["5"]) == [float(expected == "5")]


@pytest.mark.parametrize(("text", "expected"), CODE_ANSWERS)
def test_code_answers_read_alike(text, expected):
    for workflow, role in [(SingleAgent(task="code"), "generator"), (OrchWorkers(task="code"), "worker")]:
        assert workflow.formats[role].parse(text) == expected
        assert unparseable(workflow, Episode(0, [call(role, text)]), role) == float(expected is None)
        agree_as_recorded(workflow, role, text, "code", expected)
    assert extract_code(text) == expected  # what CodeReward runs


@pytest.mark.parametrize(("text", "expected"), VERDICTS)
def test_verdicts_read_alike(text, expected):
    workflow = EvalOpt(max_iterations=2)
    assert workflow.formats["evaluator"].parse(text) is expected
    episode = Episode(0, [call("generator", "\\boxed{5}"), call("evaluator", text)])
    assert unparseable(workflow, episode, "evaluator") == float(expected is None)
    agree_as_recorded(workflow, "evaluator", text, "math", expected)
    suite = TestSuite("stdin_stdout", (TestCase("", "5"),)).to_json()
    assert check_verdicts([text], ["no program"], suite)[0].said_correct is expected  # code verdict accuracy
    final, roles = run(workflow, {"generator": "\\boxed{5}", "evaluator": text})
    assert roles == (
        ["generator", "evaluator"] if expected else ["generator", "evaluator"] * 2
    )  # retry unless Correct


@pytest.mark.parametrize(("text", "expected"), SELECTIONS)
def test_selections_read_alike(text, expected):
    workflow = Voting(n_voters=3)
    fmt = workflow.formats["aggregator"]
    assert fmt.parse(text) == expected
    voters = [call("generator", f"\\boxed{{{i}}}", instance=i) for i in range(3)]
    episode = Episode(0, [*voters, call("aggregator", text)])
    assert unparseable(workflow, episode, "aggregator") == float(expected is None)
    agree_as_recorded(workflow, "aggregator", text, "math", expected)
    picked = fmt.read(text)
    assert expected is None or picked == expected
    assert workflow_metrics(workflow, [episode], [math.nan])[f"workflow/selection/{picked + 1}"] == 1.0
    assert parse_call(call("aggregator", text), workflow, "math")["value"] == picked + 1
    final, _ = run(workflow, {"generator": lambda i: f"voter {i}", "aggregator": text})
    assert final == f"voter {picked}"  # the workflow acts on the same pick


@pytest.mark.parametrize(("text", "expected"), PLANS)
def test_plans_read_alike(text, expected):
    workflow = OrchWorkers(n_workers=3)
    fmt = workflow.formats["orchestrator"]
    assert fmt.parse(text) == expected
    assert unparseable(workflow, Episode(0, [call("orchestrator", text)]), "orchestrator") == float(expected is None)
    agree_as_recorded(workflow, "orchestrator", text, "math", expected)
    _, roles = run(workflow, {"orchestrator": text, "worker": lambda i: "w", "synthesizer": "s"})
    assert roles.count("worker") == len(fmt.read(text)) == len(expected or fmt.read(text))


# ----- chat templates and the shared Eval-Opt conversation -----


def shared_conversation() -> list[dict]:
    """The evaluator's messages in the third round of a shared Eval-Opt episode (every kind of turn in order)."""
    seen = []

    async def generate(role, messages, *, instance=0):
        seen.append(messages)
        return {"generator": f"attempt {len(seen)} \\boxed{{5}}", "evaluator": f"review {len(seen)}"}[role]

    asyncio.run(EvalOpt(max_iterations=3).run(QUESTION, generate))
    return seen[-1]


QWEN3_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"  # Qwen3's template, as TRL ships it


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOY_MODEL_DIR)


@pytest.mark.parametrize("template", ["toy", "qwen3"])
@pytest.mark.parametrize(
    "messages",
    [
        pytest.param(None, id="shared-eval-opt"),
        pytest.param(
            [
                {"role": "user", "content": "solve"},
                {"role": "assistant", "content": "attempt"},
                {"role": "assistant", "content": "critique"},
                {"role": "user", "content": "again"},
            ],
            id="consecutive-assistant-turns",
        ),
    ],
)
def test_chat_templates_render_every_turn_in_order(tokenizer, template, messages):
    messages = messages or shared_conversation()
    chat_template = QWEN3_TEMPLATE.read_text() if template == "qwen3" else None
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template, enable_thinking=False
    )
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    # Each turn is its own block, under its own role, in order; consecutive assistant turns are not merged.
    assert text.startswith(expected)
    generation_prompt = "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if template == "qwen3" else "")
    assert text == expected + generation_prompt


def test_qwen3_template_drops_earlier_reasoning_from_history(tokenizer):
    """With thinking on, an earlier turn's <think> block is not shown again (as in the reference, which keeps the
    answer, not the reasoning, in the shared history): the evaluator sees the attempt's answer."""
    messages = [
        {"role": "user", "content": "solve"},
        {"role": "assistant", "content": "<think>\nlong reasoning\n</think>\n\nanswer \\boxed{5}"},
        {"role": "user", "content": "review it"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=QWEN3_TEMPLATE.read_text()
    )
    assert "long reasoning" not in text and "<|im_start|>assistant\nanswer \\boxed{5}<|im_end|>" in text
