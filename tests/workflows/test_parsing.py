r"""One rule per role: the workflow, the reward, the training metrics and the evaluators read every role output alike.

Each row feeds one role's declared format an edge case (``\fbox``, ``\boxed 5``, ``</think>``, untagged fences,
several verdict or selection boxes, cut-off output) and checks that every place that reads that role agrees: the
workflow's own decision, the reward's extraction, ``role/<role>/unparseable`` in ``workflow_metrics``, the evaluation
episode record and the toy evaluator. Also: the chat templates in use render the shared Eval-Opt conversation.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path

import pytest
import trl
from presets import preset
from transformers import AutoTokenizer

from trl_multiagent.evaluation.episodes import parse_call
from trl_multiagent.evaluation.toy import TOY, follows_format
from trl_multiagent.monitoring import workflow_metrics
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.tasks import TestCase, TestSuite, check_verdicts, extract_boxed, extract_code, math_reward
from trl_multiagent.testing import CHAT_TEMPLATE as TINY_TEMPLATE
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
VERDICTS = {  # per reading rule: "robust" (toy preset), "reference" (paper preset, the workflows' default)
    "robust": [
        ("\\boxed{Correct}", True),
        ("\\fbox{Incorrect}", False),
        ("\\boxed Correct", True),
        ("\\boxed{Incorrect} ... on reflection \\boxed{Correct}", True),  # the last verdict wins
        ("\\boxed{Correct}, but the answer is \\boxed{42}", True),  # non-verdict boxes are skipped
        ("<think>\\boxed{Correct}</think> \\boxed{Incorrect}", False),
        ("<think>\\boxed{Correct}</think> I am unsure", None),
        ("It is correct.", None),
    ],
    "reference": [
        ("\\boxed{Correct}", True),
        ("\\fbox{Incorrect}", None),  # only \boxed{...} written exactly so is a verdict
        ("\\boxed{\\text{Correct}}", None),
        ("\\boxed{Incorrect} ... on reflection \\boxed{Correct}", False),  # the first verdict wins
        ("the answer is \\boxed{42}, so \\boxed{CORRECT}", True),  # non-verdict boxes are skipped
        ("<think>\\boxed{Correct}</think> \\boxed{Incorrect}", False),
        ("It is correct.", None),
    ],
}
SELECTIONS = {  # three candidates
    "robust": [
        ("\\boxed{2}", 1),
        ("\\fbox{3}", 2),
        ("Solution 1 says \\boxed{3}; I pick \\boxed{1}", 0),  # the last box in range
        ("\\boxed{Solution 2}", 1),
        ("<think>\\boxed{1}</think> \\boxed{3}", 2),
        ("\\boxed{9}", None),  # out of range: fallback
        ("Solution 2 is best", None),  # no box: fallback (first digit in range)
    ],
    "reference": [
        ("\\boxed{2}", 1),
        ("Solution 1 says \\boxed{3}; I pick \\boxed{1}", 2),  # the first box
        ("\\boxed{Solution 2}", None),  # a box of digits only; the fallback reads the digit 2
        ("<think>\\boxed{1}</think> \\boxed{3}", 2),
        ("\\boxed{9}", None),  # out of range: fallback (its own 9, out of range too: candidate 1)
        ("Solution 2 is best", None),
    ],
}
PLANS = {  # one worker per strategy
    "robust": [
        ("STRATEGY 1: add\nSTRATEGY 2: count", ["add", "count"]),
        ("**Strategy 1:** add", ["add"]),
        ("1. add\n2. count", None),  # numbered list: a fallback
        ("just add", None),
        ("", None),
    ],
    "reference": [
        ("STRATEGY 1: add\nSTRATEGY 2: count", ["add", "count"]),
        ("1. add\n2. count", None),
        ("ok\n- add the two numbers\nfine", None),  # lines: only those over 10 characters are strategies
        ("", None),
    ],
}


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


def cases(table: dict[str, list]) -> list:
    return [pytest.param(rule, *row, id=f"{rule}-{i}") for rule, rows in table.items() for i, row in enumerate(rows)]


@pytest.mark.parametrize(("rule", "text", "expected"), cases(VERDICTS))
def test_verdicts_read_alike(rule, text, expected):
    workflow = EvalOpt(max_iterations=2, parsing=rule)
    assert workflow.formats["evaluator"].parse(text) is expected
    episode = Episode(0, [call("generator", "\\boxed{5}"), call("evaluator", text)])
    assert unparseable(workflow, episode, "evaluator") == float(expected is None)
    agree_as_recorded(workflow, "evaluator", text, "math", expected)
    suite = TestSuite("stdin_stdout", (TestCase("", "5"),)).to_json()
    said = check_verdicts([text], ["no program"], suite, rule=rule)[0].said_correct  # code verdict accuracy
    assert said is expected
    final, roles = run(workflow, {"generator": "\\boxed{5}", "evaluator": text})
    assert roles == (
        ["generator", "evaluator"] if expected else ["generator", "evaluator"] * 2
    )  # retry unless Correct


@pytest.mark.parametrize(("rule", "text", "expected"), cases(SELECTIONS))
def test_selections_read_alike(rule, text, expected):
    workflow = Voting(n_voters=3, parsing=rule)
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


@pytest.mark.parametrize(("rule", "text", "expected"), cases(PLANS))
def test_plans_read_alike(rule, text, expected):
    workflow = OrchWorkers(n_workers=3, parsing=rule)
    fmt = workflow.formats["orchestrator"]
    assert fmt.parse(text) == expected
    assert unparseable(workflow, Episode(0, [call("orchestrator", text)]), "orchestrator") == float(expected is None)
    agree_as_recorded(workflow, "orchestrator", text, "math", expected)
    _, roles = run(workflow, {"orchestrator": text, "worker": lambda i: "w", "synthesizer": "s"})
    assert roles.count("worker") == len(fmt.read(text)) == len(expected or fmt.read(text))


# ----- the judges' readers under the paper preset against the reference's -----
# Each reference_* restates one reader of the reference workflows (github XHMY/marl-llm-workflows) on plain strings;
# the tests run ours under the paper preset's parsing on fixed examples and compare.

PAPER_RULE = preset("paper_math")["parsing"]


def reference_verdict(text: str) -> bool | None:
    """examples/math_reasoning/evaluator_optimizer_math_workflow.py:183-194 (deepcoder's: :187): the first box that
    reads exactly Correct or Incorrect, in any case; ``None`` ("unknown") without one."""
    lower = text.lower()
    found = sorted((lower.find(f"\\boxed{{{word}}}"), word) for word in ("correct", "incorrect"))
    found = [(at, word) for at, word in found if at >= 0]
    return found[0][1] == "correct" if found else None


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def reference_selection(text: str, n: int) -> int:
    """examples/math_reasoning/voting_math_workflow.py:158-184 (deepcoder's: :175-201): the first box holding only
    digits, if in range; else the first digit 1-9 standing alone, if in range; else candidate 1 (0-based here)."""
    at = text.lower().find("\\boxed{")
    while at >= 0:
        content = text[at + len("\\boxed{") :].split("}", 1)
        if len(content) == 2 and content[0].isdigit():
            if 1 <= int(content[0]) <= n:
                return int(content[0]) - 1
            break
        at = text.lower().find("\\boxed{", at + 1)
    padded = f" {text} "
    for i in range(1, len(padded) - 1):
        if padded[i] in "123456789" and not _is_word(padded[i - 1]) and not _is_word(padded[i + 1]):
            return int(padded[i]) - 1 if int(padded[i]) <= n else 0
    return 0


def reference_strategy_lines(text: str, n: int) -> list[str]:
    """examples/math_reasoning/orchestrator_workers_math_workflow.py:247-258 (deepcoder's: :236-247), for an output
    with neither ``STRATEGY k:`` headers nor a numbered list: the lines over 10 characters, stripped, at most ``n``;
    none: the whole text."""
    lines = [line.strip() for line in text.split("\n") if len(line.strip()) > 10][:n]
    return lines or [text.strip()]


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{Incorrect} at first, but on reflection \\boxed{Correct}",
        "\\boxed{Correct}, though step 2 could read \\boxed{Incorrect}",
        "the answer is \\boxed{42}; \\boxed{correct}",
        "\\boxed{\\text{Correct}} ... no: \\boxed{Incorrect}",
        "\\fbox{Correct} and \\boxed{ Incorrect }",
        "It is correct.",
    ],
)
def test_paper_verdict_is_the_references_first_box(text):
    workflow = EvalOpt(max_iterations=2, parsing=PAPER_RULE)
    assert workflow.formats["evaluator"].parse(text) is reference_verdict(text)
    _, roles = run(workflow, {"generator": "\\boxed{5}", "evaluator": text})
    assert len(roles) == (2 if reference_verdict(text) else 4)  # stops exactly when the reference's is satisfied


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{3}",
        "Solution 1 says \\boxed{3}; I pick \\boxed{1}",  # the first box
        "\\boxed{Solution 2} then \\boxed{1}",  # the first box of digits
        "\\boxed{9}, I mean solution 3",  # out-of-range box, then its own 9 is the first digit: candidate 1
        "Solution 2 is the most careful.",  # digit only
        "Not 7: solution 3.",  # first digit out of range: candidate 1, not the later 3
        "Between 10 candidates, pick 2.",  # 10 is no lone digit
        "They all look fine.",  # nothing
    ],
)
def test_paper_selection_is_the_references(text):
    workflow = Voting(n_voters=3, parsing=PAPER_RULE)
    assert workflow.formats["aggregator"].read(text) == reference_selection(text, 3)
    final, _ = run(workflow, {"generator": lambda i: f"voter {i}", "aggregator": text})
    assert final == f"voter {reference_selection(text, 3)}"


PLAN_WITH_SHORT_LINES = (
    "Plan:\n- try algebra first\nok\n  use a picture of the triangle  \nten chars!\ncount the cases one by one\nmore"
)


@pytest.mark.parametrize("text", [PLAN_WITH_SHORT_LINES, "short\nlines\nonly"])
def test_paper_strategy_lines_are_the_references(text):
    workflow = OrchWorkers(n_workers=3, parsing=PAPER_RULE)
    strategies = workflow.formats["orchestrator"].read(text)
    assert strategies == reference_strategy_lines(text, 3)
    requests = []

    async def generate(role, messages, *, instance=0):
        requests.append((role, messages[-1]["content"]))
        return text if role == "orchestrator" else "\\boxed{5}"

    asyncio.run(workflow.run(QUESTION, generate))
    work = [content for role, content in requests if role == "worker"]
    assert len(work) == len(strategies)  # one worker per strategy, each given its own
    assert all(strategy in request for strategy, request in zip(strategies, work, strict=True))


def test_toy_preset_keeps_the_robust_readers():
    """The shipped toy model was trained and measured with the last-box readers: its preset keeps them."""
    assert TOY.parsing == "robust" and PAPER_RULE == "reference"
    two_boxes = "\\boxed{Incorrect} at first, but on reflection \\boxed{Correct}"
    assert EvalOpt(parsing=TOY.parsing, history="fresh", prompts="guarded").formats["evaluator"].read(two_boxes)
    assert Voting(parsing=TOY.parsing).formats["aggregator"].read("Solution 1: \\boxed{3}; pick \\boxed{1}") == 0
    plan = OrchWorkers(parsing=TOY.parsing).formats["orchestrator"].read("- a\n- b")
    assert plan == ["a", "b"]


# ----- chat templates and the shared Eval-Opt conversation -----


def shared_conversation() -> list[dict]:
    """The evaluator's messages in the third round of a shared Eval-Opt episode: the first request, five assistant
    turns in a row (attempts and critiques), the evaluate request."""
    seen = []

    async def generate(role, messages, *, instance=0):
        seen.append(messages)
        return {"generator": f"attempt {len(seen)} \\boxed{{5}}", "evaluator": f"review {len(seen)}"}[role]

    asyncio.run(EvalOpt(max_iterations=3).run(QUESTION, generate))
    assert [m["role"] for m in seen[-1]] == ["user"] + ["assistant"] * 5 + ["user"]
    return seen[-1]


QWEN3_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"  # Qwen3's template, as TRL ships it


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOY_MODEL_DIR)


@pytest.mark.parametrize("template", ["toy", "qwen3", "tiny"])
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
    chat_template = {"qwen3": QWEN3_TEMPLATE.read_text(), "tiny": TINY_TEMPLATE}.get(template)  # toy: its own
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


# ----- a completion with two or more `</think>` (documented difference, docs/fidelity.md) -----
TWO_THINK_ENDS = (
    "Draft: \\boxed{Incorrect}, pick \\boxed{2}\n```python\nprint(1)\n```\n</think>\n"
    "Second thoughts: \\boxed{7}</think>\nFinal: \\boxed{Correct} \\boxed{1}"
)


def reference_readings(content: str) -> tuple:
    """What the reference reads in a completion's content (rLLM's Qwen parser with thinking off keeps the text after
    a single `</think>`, else the whole text: rllm/parser/chat_template_parser.py:509-537): the verdict and the
    selection from the whole content (their readers above), the math answer from the text between the first and the
    second `</think>` when there is one (rllm/rewards/math_reward.py:50-51, then the last box), the program from the
    last fenced block of the whole content (rllm/rewards/code_reward.py:99-102)."""
    math_text = content.split("</think>")[1] if "</think>" in content else content
    blocks = re.findall(r"```(?:\w+)?\n(.*?)```", content, re.DOTALL)
    code = blocks[-1].strip() if blocks else None
    return reference_verdict(content), reference_selection(content, 3), extract_boxed(math_text), code


def our_readings(content: str) -> tuple:
    verdict = EvalOpt(parsing=PAPER_RULE).formats["evaluator"].parse(content)
    selection = Voting(parsing=PAPER_RULE).formats["aggregator"].read(content)
    return verdict, selection, extract_boxed(content), extract_code(content)


def test_two_think_ends_are_read_after_the_last_here_and_whole_by_the_reference():
    """With thinking off a completion holds no `</think>` of its own, and one is cut off by both parsers before any
    reader sees the text (chat_rendering="reference_qwen"): the readings agree. A completion with two is handed on
    whole by both, and read differently: every reader here reads after the last `</think>`, the reference's read the
    whole text (the math reward: between the first two)."""
    for content in ("Draft: \\boxed{Incorrect}, pick \\boxed{2}\n```python\nprint(1)\n```", "\\boxed{Correct} 3"):
        assert our_readings(content) == reference_readings(content)
    assert reference_readings(TWO_THINK_ENDS) == (False, 1, "7", "print(1)")
    assert our_readings(TWO_THINK_ENDS) == (True, 0, "1", None)
