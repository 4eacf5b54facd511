"""Math task: boxed-answer extraction, the math-verify reward (table-driven), and the DAPO-Math loader."""

import asyncio
import json
from pathlib import Path

import pytest
from presets import workflow_options

from trl_multiagent import SingleAgent
from trl_multiagent.tasks import math as math_task
from trl_multiagent.tasks.math import DAPO_MATH_ID, extract_boxed, load_dapo_math, math_reward
from trl_multiagent.workflows import problem_text

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dapo_math_17k_sample.jsonl"

# (ground truth, boxed prediction, equivalent?)
ANSWER_PAIRS = [
    # fractions, decimals and their LaTeX spellings
    (r"\frac{1}{2}", "0.5", True),
    (r"\frac{1}{2}", r"\dfrac{1}{2}", True),
    (r"\frac{1}{2}", r"\tfrac{1}{2}", True),
    (r"\frac{1}{2}", "1/2", True),
    (r"\frac{1}{2}", r"\frac12", True),
    ("0.5", r"\frac{1}{2}", True),
    (r"\frac{3}{28}", "3/28", True),
    (r"\frac{3}{28}", r"\dfrac{3}{28}", True),
    (r"\frac{3}{28}", r"\frac{6}{56}", True),
    (r"\frac{3}{28}", "7/5", False),
    (r"\frac{1}{3}", "0.3333333", True),
    (r"\frac{1}{3}", "0.33", False),
    ("7", r"\dfrac{14}{2}", True),
    ("2", "2.0", True),
    ("2", "2.00", True),
    # equations and assignments
    ("3", "x = 3", True),
    ("3", "x=3", True),
    ("x=3", "3", True),
    ("3", "x = 4", False),
    # units, symbols and spacing noise
    ("5", r"5 \text{ cm}", True),
    ("5", r"5\,\text{cm}", True),
    ("12", r"12 \mbox{ dollars}", True),
    ("10", r"10 \text{ m}^2", True),
    ("10", r"10\%", True),
    ("5", r"\$5", True),
    ("30", r"30^\circ", True),
    ("30", r"30^{\circ}", True),
    ("55", "  55  ", True),
    ("-3", "- 3", True),
    ("1000", "1,000", True),
    ("1000", "1{,}000", True),
    ("34", "34.", True),
    ("2", r"\textbf{2}", True),
    ("-15", r"\text{-15}", True),
    # symbolic forms
    (r"\sqrt{2}", r"\sqrt 2", True),
    (r"\sqrt{2}", "2^{1/2}", True),
    (r"2\pi", r"2 \pi", True),
    ("100", "10^2", True),
    ("x^2+2x+1", "(x+1)^2", True),
    (r"\{1,2\}", r"\{2,1\}", True),
    # wrong answers that look close
    ("-5", "5", False),
    ("55", "5 5", False),
    ("3", "3.5", False),
    (r"\sqrt{2}", "1.414", False),
    (r"\pi", "3.14159", False),
    ("6", r"\text{six}", False),
    ("9", "", False),
]


def test_table_has_at_least_40_pairs_of_both_kinds():
    assert len(ANSWER_PAIRS) >= 40
    assert {ok for *_, ok in ANSWER_PAIRS} == {True, False}


@pytest.mark.parametrize(("truth", "predicted", "equivalent"), ANSWER_PAIRS)
def test_math_reward_answer_table(truth, predicted, equivalent):
    completion = f"Working... so the answer is $\\boxed{{{predicted}}}$."
    assert math_reward([completion], [truth]) == [float(equivalent)]


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\{1, \{2\}\}}", r"\{1, \{2\}\}"),
        (r"\fbox{7}", "7"),
        (r"so \boxed 5 is it", "5"),
        (r"<think>\boxed{1}</think> final: \boxed{3}", "3"),
        (r"<think>\boxed{1}</think> Answer: 3", None),
        ("Answer: 34", None),
        (r"cut off \boxed{12", None),
        (r"\boxed", None),
    ],
)
def test_extract_boxed_takes_the_last_complete_box(text, boxed):
    assert extract_boxed(text) == boxed


def test_reward_accepts_plain_and_conversational_completions_and_never_raises():
    completions = [
        r"\boxed{\dfrac{3}{28}}",
        [{"role": "assistant", "content": r"The answer is \boxed{0.5}."}],
        "Answer: 3",  # the DAPO wrapper's format: no box, no credit (as in the paper)
        [],
        r"\boxed{\frac{1}{0}} \boxed{}",
        r"\boxed{)(}",
    ]
    answers = [r"\frac{3}{28}", r"\frac12", "3", "3", "3", "3"]
    assert math_reward(completions, answers, prompts=None, completion_ids=None) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_reward_runs_outside_the_main_thread():
    # math-verify's SIGALRM timeouts only work in the main thread; the reward must still grade elsewhere.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(math_reward, [r"\boxed{1/2}", r"\boxed{2}"], ["0.5", "3"]).result() == [1.0, 0.0]


def _rows(path=FIXTURE):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_loader_returns_trl_rows_split_like_the_paper():
    train, test = load_dapo_math("train", FIXTURE), load_dapo_math("test", FIXTURE)
    assert train.column_names == ["prompt", "answer"] and test.column_names == ["prompt", "answer"]
    assert (len(train), len(test)) == (7, 1)  # 10% held out (rounded up) with seed 42, as in the paper
    answers = sorted(list(train["answer"]) + list(test["answer"]))
    assert answers == sorted(r["solution"] for r in _rows())
    for row in train:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(math_task.MATH_INSTRUCTION)
    for row in load_dapo_math("train", FIXTURE, strip_answer_wrapper=True):
        (message,) = row["prompt"]
        assert message["content"].endswith(math_task.MATH_INSTRUCTION) and "Answer:" not in message["content"]
        assert not message["problem"].startswith("Solve the following math problem")
    assert len(load_dapo_math("train", FIXTURE, limit=3)) == 3


def test_the_held_out_problems_are_the_references():
    """The reference maps the published rows to its fields, then `train_test_split(test_size=0.1, seed=42)`
    (examples/math_reasoning/prepare_dapo_math_data.py:36-55); the same rows are held out here."""
    from datasets import Dataset

    reference = Dataset.from_list(_rows()).train_test_split(test_size=0.1, seed=42)
    for split in ("train", "test"):
        ours = load_dapo_math(split, FIXTURE)
        assert list(ours["answer"]) == list(reference[split]["solution"]), split
        assert [row["prompt"][0]["problem"] for row in ours] == list(reference[split]["prompt"]), split


@pytest.mark.parametrize("strip_answer_wrapper", [False, True])
def test_the_workflow_gets_the_dapo_prompt_verbatim_as_the_paper_does(strip_answer_wrapper):
    # The reference copies the processed row's `prompt` into `question` (examples/math_reasoning/
    # prepare_dapo_math_data.py:42) and its workflows render `task["question"]` as the problem
    # (single_agent_math_workflow.py:85): the "Answer:" wrapper stays. strip_answer_wrapper=True is our variant.
    rows = load_dapo_math("train", FIXTURE, strip_answer_wrapper=strip_answer_wrapper)
    rows = list(rows) + list(load_dapo_math("test", FIXTURE, strip_answer_wrapper=strip_answer_wrapper))
    paper = workflow_options("paper_math")
    workflow = SingleAgent(task="math", prompts=paper["prompts"], template=paper["template"])
    requests = []

    async def generate(role, messages, **kwargs):
        requests.append(messages[-1]["content"])
        return r"\boxed{0}"

    for row in rows:
        asyncio.run(workflow.run(row["prompt"], generate))
    given = {row["prompt"][0]["problem"] for row in rows}
    published = {raw["prompt"] for raw in _rows()}
    assert len(given) == len(rows) == len(published)
    if strip_answer_wrapper:
        assert given == {
            p.removeprefix(math_task._DAPO_PREFIX).removesuffix(math_task._DAPO_SUFFIX) for p in published
        }
        assert given.isdisjoint(published) and not any("Answer: $Answer" in r for r in requests)
    else:
        assert given == published
    assert all(problem_text(row["prompt"]) in request for row, request in zip(rows, requests, strict=True))


def test_loader_rows_reward_their_own_answers():
    rows = load_dapo_math("train", FIXTURE)
    assert math_reward([f"\\boxed{{{a}}}" for a in rows["answer"]], rows["answer"]) == [1.0] * len(rows)


def test_loader_reads_parquet_files_in_the_same_schema(tmp_path):
    from datasets import load_dataset

    path = tmp_path / "dapo.parquet"
    load_dataset("json", data_files=str(FIXTURE), split="train").to_parquet(str(path))
    assert list(load_dapo_math("test", str(path))["answer"]) == list(load_dapo_math("test", FIXTURE)["answer"])


def test_loader_reads_the_original_release_schema(tmp_path):
    # BytedTsinghua-SIA/DAPO-Math-17k: chat-list prompt, answer in reward_model.ground_truth, problems repeated.
    original = []
    for row in _rows():
        row["prompt"] = row.pop("source_prompt")
        del row["solution"]
        original += [row, row]
    path = tmp_path / "original.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in original))
    train, test = load_dapo_math("train", str(path)), load_dapo_math("test", str(path))
    assert len(train) + len(test) == 8  # duplicates dropped
    assert sorted(list(train["answer"]) + list(test["answer"])) == sorted(
        r["reward_model"]["ground_truth"] for r in original[::2]
    )


@pytest.mark.parametrize(("field", "message"), [("solution", "'solution'"), ("prompt", "'prompt'")])
def test_malformed_row_names_the_row_and_the_field(tmp_path, field, message):
    rows = _rows()
    rows[5][field] = None
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match=f"row 5 has no {message}"):
        load_dapo_math("train", str(path))


def test_loader_errors_say_how_to_fix(tmp_path):
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        load_dapo_math("validation", FIXTURE)
    with pytest.raises(FileNotFoundError, match="No dataset file"):
        load_dapo_math("train", str(tmp_path / "missing.jsonl"))


def test_hub_id_goes_through_load_dataset_with_the_paper_config(monkeypatch):
    from datasets import load_dataset

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return load_dataset("json", data_files=str(FIXTURE), split="train")

    monkeypatch.setattr("trl_multiagent.tasks.rows.load_dataset", fake_load_dataset)
    assert len(load_dapo_math("test")) == 1
    assert calls == [(DAPO_MATH_ID, "en", "train")]
