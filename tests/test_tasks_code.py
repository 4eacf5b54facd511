"""Code task: DeepCoder loader and test format, ```python extraction, and CodeReward in the sandbox."""

import json
import os
import pickle
from pathlib import Path

import pytest

from trl_multiagent.tasks.code import DEEPCODER_ID, CodeReward, extract_code, load_deepcoder, suite_from_deepcoder
from trl_multiagent.tasks.sandbox import SandboxLimits, TestSuite

FIXTURES = Path(__file__).parent / "fixtures"
DEEPCODER = FIXTURES / "deepcoder_sample.jsonl"
RAW = [json.loads(line) for line in DEEPCODER.read_text().splitlines()]
SOLUTIONS = json.loads((FIXTURES / "deepcoder_sample_solutions.json").read_text())["solutions"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the code sandbox needs root (namespaces, uid switch)")


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def test_primeintellect_tests_become_test_suites():
    stdin = suite_from_deepcoder(RAW[0]["tests"], "row 0")
    assert stdin.kind == "stdin_stdout" and stdin.fn_name is None and len(stdin.cases) == 5
    assert (stdin.cases[0].input, stdin.cases[0].output) == ("3\n1 2 3\n", "6\n")
    merge = suite_from_deepcoder(RAW[7]["tests"], "row 7")
    assert merge.kind == "function_call" and merge.fn_name == "merge_sorted"
    assert (merge.cases[0].input, merge.cases[0].output) == ([[1, 3, 5], [2, 4]], [1, 2, 3, 4, 5])  # unwrapped
    assert TestSuite.from_json(merge.to_json()) == merge


@pytest.mark.parametrize("row", [4, 5, 6, 7])
def test_lcbv5_encoding_of_the_same_tests_gives_the_same_suite(row):
    lcb = SOLUTIONS[str(row)]["lcbv5_style"]
    assert suite_from_deepcoder(lcb["tests"], "lcb", lcb["metadata"]["func_name"]) == suite_from_deepcoder(
        RAW[row]["tests"], "pi"
    )


def test_taco_encoding():
    taco = {"fn_name": "total", "inputs": [[[1, 2]], [[5]]], "outputs": [[3], [5]]}
    suite = suite_from_deepcoder(json.dumps(taco), "taco")
    assert suite == suite_from_deepcoder(
        [{"type": "function_call", "fn_name": "total", "input": [[1, 2]], "output": [3]},
         {"type": "function_call", "fn_name": "total", "input": [[5]], "output": [5]}],
        "pi",
    )  # fmt: skip


def test_loader_returns_trl_rows_split_like_the_paper():
    train, test = load_deepcoder("train", DEEPCODER), load_deepcoder("test", DEEPCODER)
    assert train.column_names == test.column_names == ["prompt", "tests"]
    assert (len(train), len(test)) == (7, 1)
    for row in list(train) + list(test):
        (message,) = row["prompt"]
        assert message["role"] == "user" and "```python" in message["content"]
        suite = TestSuite.from_json(row["tests"])
        if suite.kind == "function_call":
            assert f"`{suite.fn_name}`" in message["content"]  # the prompt says which function the tests call
        else:
            assert "standard input" in message["content"]
    kinds = sorted(TestSuite.from_json(t).kind for t in list(train["tests"]) + list(test["tests"]))
    assert kinds == ["function_call"] * 4 + ["stdin_stdout"] * 4
    assert len(load_deepcoder("train", DEEPCODER, limit=2)) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tests": None}, "row 3 has no 'tests'"),
        ({"problem": ""}, "row 3 has no 'problem'"),
        ({"tests": "[{not json"}, "row 3: 'tests' is not valid JSON"),
        ({"tests": "[]"}, "row 3: 'tests' must be a non-empty JSON list"),
        ({"tests": '[{"type": "function_call", "input": [1], "output": [1]}]'}, "row 3: function_call tests need"),
        ({"tests": '[{"type": "stdin_stdout", "input": "1"}]'}, "row 3: test 0 of 'tests' has no 'output'"),
    ],
)
def test_malformed_row_names_the_row_and_the_field(tmp_path, change, message):
    rows = [dict(r) for r in RAW]
    rows[3].update(change)
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match=message):
        load_deepcoder("train", str(path))


def test_hub_id_goes_through_load_dataset_with_the_primeintellect_config(monkeypatch):
    from datasets import load_dataset

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return load_dataset("json", data_files=str(DEEPCODER), split="train")

    monkeypatch.setattr("trl_multiagent.tasks.rows.load_dataset", fake_load_dataset)
    assert len(load_deepcoder("train")) == 7
    assert calls == [(DEEPCODER_ID, "primeintellect", "train")]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (fenced("print(1)"), "print(1)"),
        ("```python\nprint(1)\n```\ntext\n```py\nprint(2)\n```", "print(2)"),
        ("```python\nprint(1)\n```\n```text\nsample output\n```", "print(1)"),
        ("```Python3\nprint(3)\n```", "print(3)"),
        ("```\nprint(4)\n```", "print(4)"),
        ("<think>```python\nprint(0)\n```</think>no code here", None),
        ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)"),  # the last block is cut off
        ("no code at all", None),
        ("```python\n\n```", None),
    ],
)
def test_extract_code_takes_the_last_complete_python_block(text, code):
    assert extract_code(text) == code


def _fixture_batch():
    completions = [fenced(SOLUTIONS[str(i)]["correct"]) for i in range(8)]
    completions += [[{"role": "assistant", "content": fenced(SOLUTIONS[str(i)]["wrong"])}] for i in range(8)]
    completions += ["I could not solve it.", fenced("import sys\nsys.exit(0)")]
    tests = [suite_from_deepcoder(r["tests"], "fixture").to_json() for r in RAW]
    return completions, tests + tests + tests[:2]


@needs_root
def test_code_reward_all_pass_on_reference_solutions():
    completions, tests = _fixture_batch()
    reward = CodeReward(max_workers=2, limits=SandboxLimits(cpu_seconds=2, wall_seconds=4))
    assert reward.__name__ == "code_reward"
    assert reward(completions, tests, prompts=None) == [1.0] * 8 + [0.0] * 8 + [0.0, 0.0]
    assert pickle.loads(pickle.dumps(reward))(completions[:1], tests[:1]) == [1.0]  # fresh pool after unpickling


@needs_root
def test_code_reward_fraction_counts_passed_tests():
    completions, tests = _fixture_batch()
    rewards = CodeReward(mode="fraction", max_workers=2)(completions, tests)
    assert rewards[:8] == [1.0] * 8
    assert all(0.0 <= r < 1.0 for r in rewards[8:16]) and any(r > 0.0 for r in rewards[8:16])
    assert rewards[5 + 8] == 0.8  # the case-insensitive palindrome fails only on "Aa"
    assert rewards[16:] == [0.0, 0.0]


def test_code_reward_is_picklable_and_validates_its_mode():
    reward = CodeReward(mode="fraction")
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "code_reward_fraction" and clone.mode == "fraction"
    with pytest.raises(ValueError, match="'all_pass' or 'fraction'"):
        CodeReward(mode="best_of")
