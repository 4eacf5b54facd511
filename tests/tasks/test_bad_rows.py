"""Malformed training rows (`bad_rows`): the trainer names them and why before the first step, then stops or trains
on the rest with their count in every step's log; a run with no bad rows is unchanged."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from scripted import addition_dataset, boxed_answer_reward
from tiny import random_answers, tiny_trainer

from trl_multiagent.tasks.arithmetic import make_arithmetic_dataset
from trl_multiagent.tasks.bad_rows import check_training_rows, prompt_problem, row_problem
from trl_multiagent.tasks.code import CodeReward
from trl_multiagent.tasks.math import _dapo_row, load_dapo_math, math_reward
from trl_multiagent.tasks.rows import published_rows
from trl_multiagent.tasks.toy_code import make_toy_code_dataset

HUGE = "12 + 7 = ? " * 80_000  # 880,000 characters: about 200k tokens


def with_bad_rows(rows: list[dict], bad: dict[int, dict]) -> Dataset:
    """``rows`` with the rows at the keys of ``bad`` updated by their values."""
    return Dataset.from_list([{**row, **bad.get(i, {})} for i, row in enumerate(rows)])


def math_rows(n: int = 400) -> list[dict]:
    return make_arithmetic_dataset(n=n, seed=0).to_list()


MATH_BAD = {  # 1% of 400 rows
    17: {"answer": None},
    101: {"prompt": [{"role": "user", "content": "   "}]},
    250: {"prompt": [{"role": "user", "content": HUGE}]},
    399: {"answer": ""},
}


def test_stop_names_every_bad_row_and_why():
    dataset = with_bad_rows(math_rows(), MATH_BAD)
    with pytest.raises(ValueError) as refused:
        check_training_rows(dataset, [math_reward], "stop")
    message = str(refused.value)
    assert message.startswith("4 of 400 training rows are malformed:")
    assert "row 17: no 'answer' (missing, null or empty), which math_reward grades against" in message
    assert "row 101: an empty prompt" in message
    assert "row 250: a prompt of 880,000 characters, over 400,000" in message
    assert "row 399: no 'answer'" in message
    assert "`--bad_rows skip`" in message


def test_skip_leaves_out_exactly_the_bad_rows():
    rows = math_rows()
    kept, bad = check_training_rows(with_bad_rows(rows, MATH_BAD), [math_reward], "skip")
    assert [row.index for row in bad] == sorted(MATH_BAD)
    assert kept.to_list() == [row for i, row in enumerate(rows) if i not in MATH_BAD]


def test_a_clean_dataset_is_returned_as_is():
    dataset = make_arithmetic_dataset(n=50, seed=0)
    assert check_training_rows(dataset, [math_reward], "stop") == (dataset, [])


def test_code_rows_with_broken_tests():
    rows = make_toy_code_dataset(200, seed=0).to_list()
    bad = {3: {"tests": "{not json"}, 150: {"tests": json.dumps({"kind": "stdin_stdout", "cases": []})}}
    with pytest.raises(ValueError) as refused:
        check_training_rows(with_bad_rows(rows, bad), [CodeReward()], "stop")
    message = str(refused.value)
    assert "2 of 200 training rows" in message
    assert "row 3: its 'tests' are not a test suite (JSONDecodeError" in message
    assert "row 150: its 'tests' are not a test suite (ValueError: A TestSuite needs at least one test" in message


def test_text_that_is_not_text():
    """What a row read from a file may hold, which an Arrow dataset cannot: invalid UTF-8 (read with
    surrogateescape), a number where text belongs."""
    assert prompt_problem("caf\udce9") == "the prompt is not valid UTF-8"
    assert prompt_problem([{"role": "user", "content": 5}]) == "message 0's content is int, not text"
    assert prompt_problem(None) == "no 'prompt'"
    assert prompt_problem({"text": "hi"}) == "the prompt is dict, not text or a list of messages"
    row = {"prompt": "What is 2 + 2?", "answer": "4\udcff"}
    assert row_problem(row, {"answer": "math_reward"}, []) == "'answer' is not valid UTF-8"


def test_unknown_policy():
    with pytest.raises(ValueError, match="bad_rows must be 'stop' or 'skip', got 'drop'"):
        check_training_rows(addition_dataset(), [boxed_answer_reward], "drop")


def trainer(tiny_model_dir, tmp_path, dataset, **config):
    return tiny_trainer(
        tiny_model_dir,
        tmp_path,
        dataset=dataset,
        respond=random_answers,
        per_device_train_batch_size=8,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        **config,
    )


def test_the_trainer_stops_or_skips_as_told(tiny_model_dir, tmp_path):
    rows = addition_dataset(100).to_list()
    bad = {5: {"answer": None}, 60: {"prompt": [{"role": "user", "content": ""}]}}
    dataset = with_bad_rows(rows, bad)
    with pytest.raises(ValueError, match=r"2 of 100 training rows are malformed:\n  row 5: no 'answer'"):
        trainer(tiny_model_dir, tmp_path, dataset)
    skipping = trainer(tiny_model_dir, tmp_path, dataset, bad_rows="skip")
    assert skipping.train_dataset.to_list() == [row for i, row in enumerate(rows) if i not in bad]
    skipping.train()
    logs = [h for h in skipping.state.log_history if "loss" in h]
    assert [h["data/skipped_rows"] for h in logs] == [2.0, 2.0]
    clean = trainer(tiny_model_dir, tmp_path, addition_dataset(100), bad_rows="skip")
    clean.train()
    assert not any("data/skipped_rows" in h for h in clean.state.log_history)


def dapo_file(path, n: int, bad: dict[int, bytes]) -> None:
    """``n`` rows in DAPO-Math-17K's published schema, the rows at the keys of ``bad`` replaced by raw lines."""
    lines = [json.dumps({"prompt": f"What is {i} + 1?", "solution": str(i + 1)}).encode() for i in range(n)]
    path.write_bytes(b"\n".join(bad.get(i, line) for i, line in enumerate(lines)) + b"\n")


DAPO_BAD = {  # 1% of 300 lines: what a file can hold that no Arrow dataset can
    7: b'{"prompt": "What is caf\xe9 + 1?", "solution": "2"}',  # Latin-1, not UTF-8
    120: json.dumps({"prompt": 121, "solution": "122"}).encode(),  # a number where text belongs
    299: json.dumps({"prompt": "What is 299 + 1?"}).encode(),  # no answer
}


def test_a_published_file_with_bad_lines_names_them_all(tmp_path):
    path = tmp_path / "dapo.jsonl"
    dapo_file(path, 300, DAPO_BAD)
    with pytest.raises(ValueError) as refused:
        load_dapo_math("train", str(path))
    message = str(refused.value)
    assert message.startswith(f"3 of 300 rows of {path} are malformed:")
    assert f"{path}: row 7 is not valid UTF-8 (invalid continuation byte at byte 23)" in message
    assert f"{path}: row 120 has a 'prompt' of type int; expected text." in message
    assert f"{path}: row 299 has no 'solution'" in message
    assert "`--bad_rows skip`" in message


def test_skipping_bad_lines_keeps_every_other_row(tmp_path):
    bad_path, clean_path = tmp_path / "bad.jsonl", tmp_path / "clean.jsonl"
    dapo_file(bad_path, 300, DAPO_BAD)
    dapo_file(clean_path, 300, {})
    rows, _ = published_rows(
        str(bad_path), hub_id="x", hub_config=None, to_row=_dapo_row, bad_rows="skip", strip_answer_wrapper=False
    )
    clean, _ = published_rows(
        str(clean_path), hub_id="x", hub_config=None, to_row=_dapo_row, strip_answer_wrapper=False
    )
    assert rows.to_list() == [row for i, row in enumerate(clean.to_list()) if i not in DAPO_BAD]
    split = load_dapo_math("train", str(bad_path), bad_rows="skip")
    assert len(split) + len(load_dapo_math("test", str(bad_path), bad_rows="skip")) == 297
