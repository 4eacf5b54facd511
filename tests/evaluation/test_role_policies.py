"""Evaluating a mix of trained and base roles: a role set to base answers exactly as the base model does (greedy),
the other roles keep their adapters, and a role can take another checkpoint's adapter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import ROOT, run_offline
from tiny import tiny_trainer

from trl_multiagent import Voting
from trl_multiagent.evaluation import EvalSettings, evaluate, format_table, paper_table, read_results
from trl_multiagent.workflows import Workflow

GREEDY = dict(task="math", dataset_name="arithmetic", limit=4, max_completion_length=8, temperature=0.0)


class AskBoth(Workflow):
    """A user workflow whose two roles answer the same request: each role's output depends on its own weights only."""

    roles = ("generator", "aggregator")

    async def run(self, prompt, generate):
        answer = await generate("generator", prompt)
        await generate("aggregator", prompt)
        return answer


@pytest.fixture(scope="module")
def voting_run(tiny_model_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("voting")
    settings = dict(max_completion_length=6, max_steps=2, save_steps=1, learning_rate=5e-2, seed=3)
    tiny_trainer(tiny_model_dir, output_dir, Voting(), policy_sharing="isolated", **settings).train()
    return output_dir


def outputs(row) -> dict[str, list[str]]:
    """Role -> its outputs over the row's episodes, in problem order."""
    found: dict[str, list[str]] = {}
    for path in sorted(Path(row["episodes_dir"]).glob("*.json")):
        for call in json.loads(path.read_text())["calls"]:
            found.setdefault(call["role"], []).append(call["output"])
    return found


def test_a_base_role_answers_as_the_base_model_and_the_others_keep_their_adapters(voting_run, tmp_path):
    settings = EvalSettings(**GREEDY)
    trained = evaluate(voting_run, "trained", settings, workflow=AskBoth(), output_dir=tmp_path)
    base = evaluate(voting_run, "base", settings, workflow=AskBoth(), output_dir=tmp_path)
    mixed = evaluate(
        voting_run, "trained", settings, workflow=AskBoth(), output_dir=tmp_path, role_policies={"aggregator": "base"}
    )
    trained, base, mixed = outputs(trained[-1]), outputs(base[0]), outputs(mixed[-1])
    assert trained["aggregator"] != base["aggregator"]  # the trained adapter changes what the role says
    assert trained["generator"] != base["generator"]
    assert mixed["aggregator"] == base["aggregator"]
    assert mixed["generator"] == trained["generator"]


def test_a_role_takes_another_checkpoints_adapter(voting_run, tmp_path):
    settings = EvalSettings(**GREEDY)
    earlier = str(voting_run / "checkpoint-1")
    trained = evaluate(voting_run, "trained", settings, workflow=AskBoth(), output_dir=tmp_path)
    borrowed = evaluate(
        voting_run, "trained", settings, workflow=AskBoth(), output_dir=tmp_path, role_policies={"aggregator": earlier}
    )
    (step1, step2), final = [outputs(row) for row in trained], outputs(borrowed[-1])
    assert step1["aggregator"] != step2["aggregator"]  # the aggregator moved between the two checkpoints
    assert final["aggregator"] == step1["aggregator"] and final["generator"] == step2["generator"]
    assert borrowed[-1]["role_policies"] == f"aggregator={earlier}"
    assert borrowed[-1]["role_to_adapter"]["aggregator"].startswith("aggregator-")  # never the run's own name


def test_built_in_workflow_rows_say_which_roles_were_base(voting_run, tmp_path):
    settings = EvalSettings(**GREEDY)
    mixed = evaluate(voting_run, "trained", settings, output_dir=tmp_path, role_policies={"generator": "base"})
    assert [row["role_to_adapter"] for row in mixed] == [{"generator": "__base__", "aggregator": "aggregator"}] * 2
    assert evaluate(voting_run, "trained", settings, output_dir=tmp_path, role_policies={"generator": "base"}) == []
    evaluate(voting_run, "trained", settings, output_dir=tmp_path)
    table = format_table(paper_table(read_results(tmp_path)))
    assert "| trained (generator=base) |" in table and "| trained |" in table  # two cells, not one


@pytest.mark.parametrize(
    ("mode", "policies", "message"),
    [
        ("trained", {"critic": "base"}, "Voting's roles are"),
        ("trained", {"generator": "frozen"}, "neither 'trained', 'base' nor a checkpoint folder"),
        ("transfer", {"generator": "base"}, "needs mode 'trained'"),
    ],
)
def test_bad_role_policies_say_how_to_fix_them(voting_run, tmp_path, mode, policies, message):
    with pytest.raises(ValueError, match=message):
        evaluate(
            voting_run,
            mode,
            EvalSettings(**GREEDY),
            output_dir=tmp_path,
            role_policies=policies,
            workflow=Voting() if mode == "transfer" else None,
        )


@pytest.mark.slow
def test_role_policies_through_the_script(voting_run, tmp_path):
    command = [
        sys.executable,
        "recipes/evaluate.py",
        "--run_dir",
        str(voting_run / "checkpoint-2"),
        "--output_dir",
        str(tmp_path),
        "--role_policies",
        "aggregator=base",
        "--dataset_name",
        "arithmetic",
        "--limit",
        "2",
        "--max_completion_length",
        "6",
        "--temperature",
        "0",
        "--device",
        "cpu",
    ]
    result = run_offline(command, cwd=ROOT)
    (row,) = read_results(tmp_path)
    assert row["role_to_adapter"] == {"generator": "generator", "aggregator": "__base__"}
    assert "trained (aggregator=base)" in result.stdout
