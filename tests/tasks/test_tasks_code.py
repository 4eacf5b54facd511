"""Code task: DeepCoder loader and test format, ```python extraction, and CodeReward in the sandbox."""

import json
import pickle
from pathlib import Path

import pytest
from harness import needs_sandbox
from reference_rules import livecodebench_question

from trl_multiagent.tasks.code import (
    DEEPCODER_ID,
    LIVECODEBENCH_LAYOUT,
    CodeReward,
    ProblemLayout,
    _deepcoder_row,
    code_prompt,
    extract_code,
    load_deepcoder,
    suite_from_deepcoder,
)
from trl_multiagent.tasks.sandbox import SandboxLimits, TestSuite

FIXTURES = Path(__file__).parents[1] / "fixtures"
DEEPCODER = FIXTURES / "deepcoder_sample.jsonl"
RAW = [json.loads(line) for line in DEEPCODER.read_text().splitlines()]
# Two rows in DeepCoder's lcbv5 schema (problem, starter_code, metadata, tests with testtype): a functional problem
# with LeetCode-style starter code, and a stdin problem whose starter_code is empty.
LCBV5 = FIXTURES / "deepcoder_lcbv5_sample.jsonl"
LCBV5_RAW = [json.loads(line) for line in LCBV5.read_text().splitlines()]
SOLUTIONS = json.loads((FIXTURES / "deepcoder_sample_solutions.json").read_text())["solutions"]


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
        [
            {"type": "function_call", "fn_name": "total", "input": [[1, 2]], "output": [3]},
            {"type": "function_call", "fn_name": "total", "input": [[5]], "output": [5]},
        ],
        "pi",
    )


def test_loader_returns_trl_rows_split_like_the_paper():
    train, test = load_deepcoder("train", DEEPCODER), load_deepcoder("test", DEEPCODER)
    assert train.column_names == test.column_names == ["prompt", "tests"]
    assert (len(train), len(test)) == (7, 1)
    layout = ProblemLayout.from_json(LIVECODEBENCH_LAYOUT)
    problems = {raw["problem"] for raw in RAW}
    for row in list(train) + list(test):
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].startswith(layout.system + "\n\n")
        problem = message["content"].removeprefix(layout.system + "\n\n").partition(layout.format_without_starter_code)
        assert problem[0] in problems and problem[1]  # the problem verbatim, then the format line (no starter code)
    kinds = sorted(TestSuite.from_json(t).kind for t in list(train["tests"]) + list(test["tests"]))
    assert kinds == ["function_call"] * 4 + ["stdin_stdout"] * 4
    assert len(load_deepcoder("train", DEEPCODER, limit=2)) == 2


def test_the_instruction_layout_says_how_the_program_is_run():
    for row in load_deepcoder("train", DEEPCODER, problem_layout="instruction"):
        (message,) = row["prompt"]
        suite = TestSuite.from_json(row["tests"])
        assert message["content"].endswith(code_prompt("", suite)[0]["content"].strip())
        if suite.kind == "function_call":
            assert f"`{suite.fn_name}`" in message["content"]  # the prompt says which function the tests call
        else:
            assert "standard input" in message["content"]


@pytest.mark.parametrize(
    ("raw", "starter_code"),
    [(LCBV5_RAW[0], LCBV5_RAW[0]["starter_code"]), (LCBV5_RAW[1], None), (RAW[4], None)],
    ids=["lcbv5-functional-starter-code", "lcbv5-stdin-empty-starter-code", "primeintellect-no-starter-code"],
)
def test_the_paper_layout_is_livecodebenchs_as_the_reference_builds_it(raw, starter_code):
    """The row's text is the reference's question laid out from our sentences (livecodebench_layout.json): the
    starter code, when the row has some, in the python block under its format line; else the standard-input format
    line over the placeholder (a PrimeIntellect row has no starter_code column, an lcbv5 stdin row an empty one)."""
    sentences = json.loads(LIVECODEBENCH_LAYOUT.read_text())["code_problem"]
    (message,) = _deepcoder_row(raw, 0, "fixture", ProblemLayout.from_json(LIVECODEBENCH_LAYOUT))["prompt"]
    assert message["content"] == livecodebench_question(raw["problem"], starter_code, sentences)
    if starter_code:
        assert f"{sentences['format_with_starter_code']}\n```python\n{starter_code}\n```" in message["content"]


def test_the_layout_text_comes_from_its_file(tmp_path):
    """Another file with the same keys changes every sentence; a file without them is refused by name."""
    sentences = {key: f"<{key}>" for key in json.loads(LIVECODEBENCH_LAYOUT.read_text())["code_problem"]}
    mine = tmp_path / "layout.json"
    mine.write_text(json.dumps({"code_problem": sentences}))
    (row,) = load_deepcoder("test", str(LCBV5), problem_layout=str(mine))["prompt"]
    raw = next(r for r in LCBV5_RAW if r["problem"] in row[0]["content"])
    assert row[0]["content"] == livecodebench_question(raw["problem"], raw["starter_code"] or None, sentences)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"code_problem": {"system": "x"}}))
    with pytest.raises(ValueError, match="'code_problem' object with the texts"):
        load_deepcoder("train", str(LCBV5), problem_layout=str(broken))
    with pytest.raises(ValueError, match="Unknown problem layout"):
        load_deepcoder("train", str(LCBV5), problem_layout="leetcode")


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


@needs_sandbox
def test_code_reward_all_pass_on_reference_solutions():
    completions, tests = _fixture_batch()
    reward = CodeReward(max_workers=2, limits=SandboxLimits(cpu_seconds=2, wall_seconds=4))
    assert reward.__name__ == "code_reward"
    assert reward(completions, tests, prompts=None) == [1.0] * 8 + [0.0] * 8 + [0.0, 0.0]
    assert pickle.loads(pickle.dumps(reward))(completions[:1], tests[:1]) == [1.0]  # fresh pool after unpickling


@needs_sandbox
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


# The reference's own code-reward cases (marl-llm-workflows tests/rewards/test_code_reward.py), each as a DeepCoder
# row in its source's `tests` encoding plus the answer text, with the score the reference asserts for it. The
# programs are ours, with what matters to a grader kept: prose around the fence, a closing fence indented inside the
# answer, a `__main__` guard, a `class Solution` method annotated `List[int]` (the name comes from the grader's
# prelude), a Python-level endless loop and a regex that burns CPU in C. Inputs, outputs and expected scores are the
# reference's.
_SHORTEST_TOUR = """import sys
from itertools import permutations
def main():
    n, m, r = map(int, sys.stdin.readline().split())
    towns = list(map(int, sys.stdin.readline().split()))
    inf = float("inf")
    d = [[0 if i == j else inf for j in range(n + 1)] for i in range(n + 1)]
    for _ in range(m):
        a, b, c = map(int, sys.stdin.readline().split())
        d[a][b] = d[b][a] = c
    for k in range(1, n + 1):
        for i in range(1, n + 1):
            for j in range(1, n + 1):
                d[i][j] = min(d[i][j], d[i][k] + d[k][j])
    print(min(sum(d[p[i]][p[i + 1]] for i in range(r - 1)) for p in permutations(towns)))
if __name__ == "__main__":
    main()
    ```
    """
_TOUR_TESTS = {
    "inputs": [
        "4 3 3\n1 2 3\n1 2 3\n2 3 2\n3 4 4\n",
        "5 10 4\n1 2 3 4\n1 2 5\n1 3 5\n1 4 5\n1 5 5\n2 3 5\n2 4 5\n2 5 5\n3 4 5\n3 5 5\n4 5 5\n",
        "7 21 4\n1 3 5 7\n1 2 4\n1 3 8\n1 4 1\n1 5 7\n1 6 3\n1 7 9\n2 3 5\n2 4 2\n2 5 6\n2 6 8\n2 7 4\n3 4 7\n3 5 9\n"
        "3 6 1\n3 7 6\n4 5 3\n4 6 5\n4 7 8\n5 6 2\n5 7 4\n6 7 7\n",
    ],
    "outputs": ["5\n", "15\n", "11\n"],
}
_ONE_STDIN_TEST = [{"input": "1\n", "output": "1\n", "testtype": "stdin"}]
REFERENCE_CASES = {  # name: (row, answer, the score the reference asserts), reference test file line
    "code_contests": ({"tests": json.dumps(_TOUR_TESTS)}, "\n```python\n" + _SHORTEST_TOUR, 1.0),  # :12
    "codeforces": (  # :70
        {
            "tests": json.dumps(
                [
                    {"input": i, "output": o}
                    for i, o in [
                        ("3 30\n2 2 1", "5"),
                        ("3 20\n2 1 1", "-1"),
                        ("4 45\n5 5 5 5", "-1"),
                        ("5 100\n10 10 10 10 10", "10"),
                        ("1 20\n5", "3"),
                        ("2 100\n1 1", "19"),
                        ("3 35\n5 5 5", "4"),
                    ]
                ]
            )
        },
        "\n```python\nimport sys\ndef main():\n    n, d = map(int, input().split())\n"
        "    songs = sum(map(int, input().split()))\n"
        "    print((d - songs) // 5 if songs + 10 * (n - 1) <= d else -1)\n"
        'if __name__ == "__main__":\n    main()\n    ```\n    ',
        1.0,
    ),
    "taco_stdin": ({"tests": json.dumps(_TOUR_TESTS)}, "\n```python\n" + _SHORTEST_TOUR, 1.0),  # :183
    "taco_call_based": (  # :241
        {
            "tests": json.dumps(
                {
                    "fn_name": "is_anagram",
                    "inputs": [
                        ["foefet", "toffee"],
                        ["Buckethead", "DeathCubeK"],
                        ["Twoo", "WooT"],
                        ["dumble", "bumble"],
                        ["ound", "round"],
                        ["apple", "pale"],
                    ],
                    "outputs": [[True], [True], [True], [False], [False], [False]],
                }
            )
        },
        "\n```python\ndef is_anagram(test, original):\n"
        "    return sorted(test.lower()) == sorted(original.lower())\n```\n",
        1.0,
    ),
    "taco_call_based_list_argument": (  # :268
        {
            "tests": json.dumps(
                {
                    "fn_name": "total",
                    "inputs": [
                        [[1, 2, 3, 4, 5]],
                        [[1, 2, 3, 4]],
                        [[1, 2, 3]],
                        [[4, 4, 52, 23, 32, 1, -1]],
                        [[4, 4, 5, -1]],
                        [[-1, -1, -1]],
                        [[-1, -1, -10, 42, 92, 1, 23, 6, -3]],
                        [[-1, 1, -1, 1]],
                        [[42]],
                    ],
                    "outputs": [[48], [20], [8], [1753], [30], [-4], [9248], [0], [42]],
                }
            )
        },
        "\n```python\ndef total(arr):\n    while len(arr) > 1:\n"
        "        arr = [a + b for a, b in zip(arr, arr[1:])]\n    return arr[0]\n```\n",
        1.0,
    ),
    "livecodebench_stdin": (  # :300
        {"tests": json.dumps([{"input": "3\n12345 530391 12345\n", "output": "2\n", "testtype": "stdin"}])},
        "\nYes of course!\n```python\nimport json\n\ndef main():\n    input()\n    numbers = input().split()\n"
        "    print(len({x for x in numbers if numbers.count(x) > 1}) + 1)\n"
        'if __name__ == "__main__":\n    main()\n```\n',
        1.0,
    ),
    "livecodebench_functional": (  # :332
        {
            "tests": json.dumps([{"input": "[5, 3, 10, 8, 2]\n5", "output": "3", "testtype": "functional"}]),
            "metadata": {"func_name": "numberOfEmployeesWhoMetTarget"},
        },
        "\nYes of course!\n```python\nclass Solution:\n"
        "    def numberOfEmployeesWhoMetTarget(self, hours: List[int], target: int) -> int:\n"
        "        return sum(1 for h in hours if h >= target)\n```\n",
        1.0,
    ),
    "infinite_loop": (  # :443
        {"tests": json.dumps(_ONE_STDIN_TEST)},
        '```python\ndef main():\n    while True:\n        pass\nif __name__ == "__main__":\n    main()\n```',
        0.0,
    ),
    "c_level_cpu_burn": (  # :458
        {"tests": json.dumps(_ONE_STDIN_TEST)},
        "```python\nimport re\ndef main():\n    re.match(r'(a+)+$', 'a' * 30 + 'b')\n    print(\"1\")\n"
        'if __name__ == "__main__":\n    main()\n```',
        0.0,
    ),
}


@needs_sandbox
def test_reference_code_reward_cases_score_as_the_reference_asserts():
    cases = list(REFERENCE_CASES.values())
    rows = [
        _deepcoder_row({"problem": "A problem.", **row}, i, "reference cases") for i, (row, _, _) in enumerate(cases)
    ]
    answers = [answer for _, answer, _ in cases]
    reward = CodeReward(max_workers=2, limits=SandboxLimits(cpu_seconds=2, wall_seconds=3))
    scores = dict(zip(REFERENCE_CASES, reward(answers, [row["tests"] for row in rows]), strict=True))
    assert scores == {name: expected for name, (_, _, expected) in REFERENCE_CASES.items()}
    kinds = [TestSuite.from_json(row["tests"]).kind for row in rows]
    assert (
        kinds
        == ["stdin_stdout"] * 3 + ["function_call"] * 2 + ["stdin_stdout", "function_call"] + ["stdin_stdout"] * 2
    )
