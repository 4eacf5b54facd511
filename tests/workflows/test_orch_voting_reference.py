r"""Orch-Workers and Voting under the paper preset against the reference, rule by rule and call by call.

The reference (github XHMY/marl-llm-workflows) reads an orchestrator's plan with ``parse_proposals``
(``examples/math_reasoning/orchestrator_workers_math_workflow.py:210-269``, the DeepCoder copy
``examples/deepcoder/deepcoder_orchestrator_workers_workflow.py:199-258``), runs one worker per strategy
(``rllm/workflows/orchestrator_workers_workflow.py:487-493``) and shows the synthesizer every solution under a header
naming its strategy (``..._math_workflow.py:182-188``, deepcoder ``:172-178``); Voting shows the aggregator every
answer under ``--- Solution i ---`` (``examples/math_reasoning/voting_math_workflow.py:122-125``, deepcoder
``:146-149``) and grades the answer it selects (``voting_math_workflow.py:158-184``). The functions below restate those
rules on plain strings, written as scanners rather than the reference's regular expressions; the tests run ours under
the paper preset's workflow options (``recipes/configs/paper_math.yaml``) on fixed strings and on scripted episodes
through the rollout engine and compare. Our prompt wording is a paraphrase (the paper prompt set), so the expected
requests are our templates filled with what the reference puts in them.
"""

from __future__ import annotations

import inspect

import pytest
from presets import workflow_options
from scripted import ScriptedBackend
from transformers import AutoTokenizer

from trl_multiagent.rollout.engine import RolloutEngine
from trl_multiagent.workflows import OrchWorkers, Voting
from trl_multiagent.workflows.prompt_set import PromptSet
from trl_multiagent.workflows.prompts import PROMPT_SETS

PAPER = workflow_options("paper_math")
TOY = workflow_options("toy")
DIGITS = "0123456789"
BLANKS = " \t\n\r\f\v"


def preset(workflow_class, name: str = "paper_math", **kwargs):
    """``workflow_class`` built with the preset's keyword arguments that it takes."""
    accepted = inspect.signature(workflow_class).parameters
    return workflow_class(**{k: v for k, v in workflow_options(name).items() if k in accepted}, **kwargs)


# ----- the reference's strategy reader, restated -----


def _skip(text: str, at: int, chars: str) -> int:
    while at < len(text) and text[at] in chars:
        at += 1
    return at


def _header(text: str, at: int) -> tuple[int, int] | None:
    """A ``STRATEGY k:`` header at ``at`` (any case, blanks allowed around ``k``): where it ends and ``k``."""
    if text[at : at + len("strategy")].lower() != "strategy":
        return None
    first = _skip(text, at + len("strategy"), BLANKS)
    last = _skip(text, first, DIGITS)
    colon = _skip(text, last, BLANKS)
    if last == first or colon == len(text) or text[colon] != ":":
        return None
    return colon + 1, int(text[first:last])


def _line_start(text: str, at: int) -> bool:
    return at == 0 or text[at - 1] == "\n"


def _item(text: str, at: int) -> tuple[int, int] | None:
    """A numbered item at line start ``at``: blanks (newlines too), ``k``, then ``.`` or ``)``; its end and ``k``."""
    if not _line_start(text, at):
        return None
    first = _skip(text, at, BLANKS)
    last = _skip(text, first, DIGITS)
    if last == first or last == len(text) or text[last] not in ".)":
        return None
    return last + 1, int(text[first:last])


def _scan(text: str, opener, stops) -> list[str]:
    """Left to right: an opener, blanks, then at least one character up to the first later position where ``stops``
    holds (when only blanks follow the opener, the last of them is the text); every text stripped, then ordered by
    its ``k`` (equal ``k`` as written)."""
    found, at = [], 0
    while at < len(text):
        opened = opener(text, at)
        if opened is None or opened[0] == len(text):
            at += 1
            continue
        start = min(_skip(text, opened[0], BLANKS), len(text) - 1)
        end = start + 1
        while not stops(text, end):
            end += 1
        found.append((opened[1], text[start:end].strip()))
        at = end
    return [strategy for _, strategy in sorted(found, key=lambda pair: pair[0])]


def reference_headers(text: str) -> list[str]:
    """``..._math_workflow.py:224-235``: each ``STRATEGY k:`` runs to the next header, or to the end of the text
    (before a final newline)."""

    def stops(text, at):
        return at == len(text) or (at == len(text) - 1 and text[-1] == "\n") or _header(text, at) is not None

    return _scan(text, _header, stops)


def reference_items(text: str) -> list[str]:
    """``..._math_workflow.py:237-245``: each numbered item runs to the next line that starts a numbered item, or
    to the end."""
    return _scan(text, _item, lambda text, at: at == len(text) or _item(text, at) is not None)


def reference_strategies(text: str, n: int) -> list[str]:
    """``..._math_workflow.py:222-262``: headers, else numbered items, else the first ``n`` lines over 10
    characters, else the whole text; at most ``n`` (``max_subtasks``, 3 in the paper's runs:
    ``dashboard/launch_experiment.sh:146,158``)."""
    lines = [line.strip() for line in text.split("\n") if len(line.strip()) > 10][:n]
    return (reference_headers(text) or reference_items(text) or lines or [text.strip()])[:n]


def reference_solutions(responses: list[str], strategies: list[str] | None = None) -> str:
    """``{solutions}``: ``voting_math_workflow.py:123-125`` and ``..._math_workflow.py:182-188``."""
    if strategies is None:
        return "".join(f"\n--- Solution {i} ---\n{response}\n" for i, response in enumerate(responses, 1))
    blocks = zip(strategies, responses, strict=True)
    return "".join(f"\n--- Solution {i} (Strategy: {s}) ---\n{r}\n" for i, (s, r) in enumerate(blocks, 1))


MARKDOWN_PLAN = (
    "Here is my plan.\n\n**STRATEGY 3:** Count up from 2.\n**STRATEGY 1:** Add directly: $2+3$.\n"
    "**STRATEGY 2:** Draw a *number line*.\n**STRATEGY 4:** Guess."
)
NUMBERED_PLAN = "Approaches:\n2) Sort, then scan once.\n1. Brute force over all pairs.\n\n3. Use a hash map."
PLANS = [
    MARKDOWN_PLAN,  # ordered by number, capped after ordering, markdown kept
    "STRATEGY 2: count up\nSTRATEGY 1: add\n\nBoth work.",  # trailing prose stays with the last strategy
    "Using strategy 2: counting, or else STRATEGY 1: adding",  # headers inside prose count
    "**Strategy 1**: add the numbers\n**Strategy 2**: count up from two",  # no header so: the lines
    "STRATEGY 1:\nSTRATEGY 2: count up",  # an empty strategy swallows the next header
    "STRATEGY 1:\n",  # one worker with an empty strategy
    "STRATEGY 1: add\r\nstrategy 1: again\r\nSTRATEGY  10 : last",  # equal numbers keep their order; any case
    NUMBERED_PLAN,  # numbered items ordered, with ')' too
    "1. **Algebra**: write it out\n2. - a picture",  # markdown kept in items
    "1.\n2. count up",  # an empty item swallows the next
    "Plan:\n3) third idea\n   10. tenth idea\n2. second idea\n1. first idea",
    "1.5 is a ratio\n2.5 is another",  # numbers at a line start are items
    "ok\nshort\n- add the two numbers\n- count up from two\n- draw the sum\n- guess",  # lines over 10 characters
    "fine",  # the whole text
    "",
]


@pytest.mark.parametrize("text", PLANS)
@pytest.mark.parametrize("task", ["math", "code"])
def test_paper_strategies_are_the_references(task, text):
    workflow = preset(OrchWorkers, task=task)
    assert workflow.formats["orchestrator"].read(text) == reference_strategies(text, 3)


def test_the_restatement_on_the_issue_cases():
    """The reference's reader on the cases the issue names, spelled out: order by number, markdown kept."""
    assert reference_strategies(MARKDOWN_PLAN, 3) == [
        "** Add directly: $2+3$.\n**",
        "** Draw a *number line*.\n**",
        "** Count up from 2.\n**",
    ]
    assert reference_strategies(NUMBERED_PLAN, 3) == [
        "Brute force over all pairs.",
        "Sort, then scan once.",
        "Use a hash map.",
    ]
    assert reference_strategies("STRATEGY 1:\nSTRATEGY 2: count up", 3) == ["STRATEGY 2: count up"]
    assert reference_strategies("STRATEGY 1:\n", 3) == [""]


def test_toy_preset_reads_plans_as_before():
    """The toy preset keeps the robust reader its model was trained with: order of appearance, markdown stripped;
    with its fixed worker count only ``STRATEGY k:`` headers count (the workflow fills the rest)."""
    toy = preset(OrchWorkers, "toy").formats["orchestrator"]
    assert toy.read(MARKDOWN_PLAN) == ["Count up from 2.", "Add directly: $2+3$.", "Draw a *number line*."]
    assert toy.read(NUMBERED_PLAN) == [] and toy.parse("**Strategy 1**: x") is None  # needs all 3 headers
    robust = OrchWorkers(parsing=TOY["parsing"]).formats["orchestrator"]
    assert robust.read(NUMBERED_PLAN) == ["Sort, then scan once.", "Brute force over all pairs.", "Use a hash map."]
    assert robust.read("STRATEGY 1:\nSTRATEGY 2: count up") == ["count up"]
    assert robust.parse("**Strategy 1**: x") == ["x"]
    assert preset(OrchWorkers).formats["orchestrator"].parse("**Strategy 1**: x") is None  # not the reference's header


# ----- whole episodes through the rollout engine -----

PROMPTS = {
    "math": [{"role": "user", "content": "What is 2 + 3?"}],
    "code": [{"role": "user", "content": "Read n from standard input and print n + 1."}],
}
ORCH = {"orchestrator": "o", "worker": "w", "synthesizer": "s"}
VOTE = {"generator": "g", "aggregator": "a"}


def filled(template: str, **values: str) -> str:
    """One of our templates with its placeholders replaced (the expected text, built without our renderer)."""
    text = template.replace("{{", "\x00").replace("}}", "\x01")
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text.replace("\x00", "{").replace("\x01", "}")


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize(("task", "plan"), [("math", MARKDOWN_PLAN), ("code", NUMBERED_PLAN), ("math", "")])
def test_orch_workers_calls_are_the_references(task, plan, tokenizer):
    problem = PROMPTS[task][0]["content"]
    strategies = reference_strategies(plan, 3)
    answer = "\\boxed{5}" if task == "math" else "```python\nprint(int(input()) + 1)\n```"
    solutions = [f"worker on strategy {i + 1}: {answer}" for i in range(len(strategies))]
    final = f"Solutions agree. {answer}"
    templates = PROMPT_SETS["paper"][task]
    work = [filled(templates.work, problem=problem, strategy=strategy) for strategy in strategies]

    def respond(requests, rng):
        by_adapter = {"o": lambda r: plan, "w": lambda r: solutions[work.index(r.messages[0]["content"])]}
        return [by_adapter.get(r.adapter, lambda r: final)(r) for r in requests]

    backend = ScriptedBackend(tokenizer, respond)
    (episode,) = RolloutEngine(preset(OrchWorkers, task=task), backend, ORCH).run([PROMPTS[task]])

    strategy_format = "\n".join(f"STRATEGY {k}: <strategy>" for k in (1, 2, 3))
    propose = filled(templates.propose, problem=problem, max_subtasks="3", strategy_format=strategy_format)
    synthesize = filled(templates.synthesize, problem=problem, solutions=reference_solutions(solutions, strategies))
    expected = [
        ("orchestrator", 0, user(propose)),
        *(("worker", i, user(work[i])) for i in range(len(strategies))),  # one per strategy, in the reference's order
        ("synthesizer", 0, user(synthesize)),
    ]
    assert sorted(((call.role, call.instance, call.messages) for call in episode.calls), key=repr) == sorted(
        expected, key=repr
    )
    assert sorted((r.messages for r in backend.requests), key=repr) == sorted((m for *_, m in expected), key=repr)
    assert episode.final_answer == final  # the synthesizer's output is graded (orchestrator_workers_workflow.py:525)


@pytest.mark.parametrize("task", ["math", "code"])
def test_voting_calls_are_the_references(task, tokenizer):
    problem = PROMPTS[task][0]["content"]
    answer = "\\boxed{5}" if task == "math" else "```python\nprint(int(input()) + 1)\n```"
    # The first box names candidate 3; the robust (toy) reader would take the last box, candidate 2.
    choice = "Solution 1 says \\boxed{3}... on reflection \\boxed{2}"
    voters = iter(f"voter {i}: {answer}" for i in range(3))

    def respond(requests, rng):
        return [next(voters) if r.adapter == "g" else choice for r in requests]

    backend = ScriptedBackend(tokenizer, respond)
    (episode,) = RolloutEngine(preset(Voting, task=task), backend, VOTE).run([PROMPTS[task]])

    responses = [call.text for call in sorted(episode.calls, key=lambda c: c.instance) if call.role == "generator"]
    templates = PROMPT_SETS["paper"][task]
    expected = [
        *(("generator", i, user(filled(templates.vote, problem=problem))) for i in range(3)),
        (
            "aggregator",
            0,
            user(filled(templates.aggregate, problem=problem, solutions=reference_solutions(responses))),
        ),
    ]
    assert [(call.role, call.instance, call.messages) for call in episode.calls] == expected
    assert [request.messages for request in backend.requests] == [messages for *_, messages in expected]
    assert episode.final_answer == responses[2]  # the selected voter's answer is graded (voting_workflow.py:281-287)


def test_a_prompt_record_from_before_the_separator_renders_as_it_did():
    """A checkpoint's recorded prompt set without ``solutions_separator`` joins its blocks by a blank line, as the
    workflows did when it was saved; a current record round-trips."""
    record = PROMPT_SETS["paper"]["math"].to_dict()
    old = {**record, "solution_block": "--- Solution {index} ---\n{solution}"}
    del old["solutions_separator"]
    assert PromptSet.from_dict(old).solutions(["a", "b"]) == "--- Solution 1 ---\na\n\n--- Solution 2 ---\nb"
    assert PromptSet.from_dict(record) == PROMPT_SETS["paper"]["math"]
    assert PROMPT_SETS["paper"]["math"].solutions(["a", "b"]) == reference_solutions(["a", "b"])
    assert PROMPT_SETS["paper"]["code"].solutions(["a"], ["s"]) == reference_solutions(["a"], ["s"])
