"""The mechanism figures of the toy page come from run folders through checked-in CSVs: the scripts collect what runs
logged (tested on run folders written here), draw from the CSVs, and the page quotes the CSVs' numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from harness import load_script
from transformers import TrainerState

from trl_multiagent import MultiAgentGRPOConfig

amplification = load_script("scripts/toy_amplification.py")
capture = load_script("scripts/toy_capture.py")


def write_run(folder: Path, *, workflow: dict, roles: list[str], sharing: str, history: list[dict], **args) -> Path:
    """A run folder as training leaves it: trainer_state.json, multiagent_config.json, training_args.bin."""
    folder.mkdir(parents=True)
    state = TrainerState()
    state.log_history = [*history, {"step": len(history), "train_runtime": 1.0}]
    state.save_to_json(str(folder / "trainer_state.json"))
    config = {"workflow": workflow, "policy_sharing": sharing, "role_to_adapter": {r: r for r in roles}}
    (folder / "multiagent_config.json").write_text(json.dumps(config))
    settings = MultiAgentGRPOConfig(output_dir=str(folder), use_cpu=True, bf16=False, policy_sharing=sharing, **args)
    torch.save(settings, folder / "training_args.bin")
    return folder


def voting_run(root: Path, voters: int, schedule: str, seed: int, sizes: list[float]) -> Path:
    history = [
        {
            "step": step,
            "workflow/success": 0.5,
            "role/generator/update_chi_square": size,
            "role/aggregator/update_chi_square": 1e-3,
            "role/generator/grad_norm": 0.3,
            **({"adapter/generator/optimizer_steps": float(voters)} if schedule == "mini_batches" else {}),
        }
        for step, size in enumerate(sizes, start=1)
    ]
    return write_run(
        root / f"voting-n{voters}-{schedule}-s{seed}",
        workflow={"workflow": "Voting", "n_voters": voters},
        roles=["generator", "aggregator"],
        sharing="isolated",
        history=history,
        update_schedule=schedule,
        seed=seed,
    )


def test_the_sweep_points_are_each_seeds_median_over_its_steps(tmp_path):
    voting_run(tmp_path / "runs", 2, "merged", 1, [1.0, 2.0, 30.0])
    voting_run(tmp_path / "runs", 2, "merged", 2, [3.0, 4.0, 5.0])
    voting_run(tmp_path / "runs", 8, "mini_batches", 1, [10.0, 20.0, 90.0])
    rows = amplification.read_rows(amplification.collect([tmp_path / "runs"], [], tmp_path / "amplification.csv"))
    sizes = amplification.sweep_points(rows, "Voting", "generator", "update_chi_square")
    assert sizes == {"merged": {2: [2.0, 4.0]}, "mini_batches": {8: [20.0]}}
    per_update = amplification.sweep_points(rows, "Voting", "generator", "grad_norm_per_update")
    assert per_update["mini_batches"][8] == [pytest.approx(0.3 / 8**0.5)] and per_update["merged"][2] == [0.3, 0.3]


def test_capture_rows_hold_each_roles_shares(tmp_path):
    history = [
        {
            "step": 1,
            "workflow/success": 0.5,
            "workflow/selection_accuracy": 0.7,
            "role/generator/calls": 96.0,
            "role/aggregator/calls": 32.0,
            "role/generator/completion_length": 10.0,
            "role/aggregator/completion_length": 30.0,
            "role/generator/grad_norm_share": 0.9,
            "role/aggregator/grad_norm_share": 0.1,
            "alarm/aggregator/judge_base_rate": 1.0,
        }
    ]
    run = write_run(
        tmp_path / "runs" / "voting-per_role-s1",
        workflow={"workflow": "Voting", "n_voters": 3},
        roles=["generator", "aggregator"],
        sharing="shared",
        history=history,
        role_loss_balance="per_role",
        seed=1,
    )
    rows = capture.read_rows(capture.collect([run.parent], tmp_path / "capture.csv"))
    values = {(row["role"], row["metric"]): row["value"] for row in rows}
    assert rows[0]["balance"] == "per_role" and rows[0]["workflow"] == "Voting"
    assert values["generator", "gradient_share"] == 0.9
    assert values["generator", "output_share"] == 0.75 and values["aggregator", "token_share"] == 0.5
    assert values["", "selection_accuracy"] == 0.7
    assert values["aggregator", "alarm/judge_base_rate"] == 1.0


def test_a_capture_run_with_role_weights_is_labelled_by_them(tmp_path):
    history = [{"step": 1, "workflow/success": 0.5, "role/generator/calls": 32.0, "role/evaluator/calls": 32.0}]
    run = write_run(
        tmp_path / "runs" / "eval_opt-evaluator_x5-s2",
        workflow={"workflow": "EvalOpt"},
        roles=["generator", "evaluator"],
        sharing="shared",
        history=history,
        role_loss_weights={"evaluator": 5.0},
        seed=2,
    )
    rows = capture.run_rows(run)
    assert {(row["balance"], row["seed"]) for row in rows} == {("evaluator_x5", 2)}


def test_capture_refuses_an_isolated_run(tmp_path):
    run = write_run(
        tmp_path / "isolated",
        workflow={"workflow": "Voting", "n_voters": 3},
        roles=["generator", "aggregator"],
        sharing="isolated",
        history=[{"step": 1, "workflow/success": 0.5}],
    )
    with pytest.raises(ValueError, match="capture needs 'shared'"):
        capture.run_rows(run)


@pytest.mark.parametrize("script", [amplification, capture], ids=["amplification", "capture"])
def test_the_scripts_draw_the_checked_in_data(tmp_path, script):
    pytest.importorskip("matplotlib")
    png = script.draw(script.read_rows(), tmp_path / "figure.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_records_tables_are_the_checked_in_datas():
    """docs/toy-records.md quotes the tables the scripts print from the CSVs (records M1, M2, M4)."""
    records = (Path(__file__).resolve().parents[2] / "docs" / "toy-records.md").read_text()
    rows = amplification.read_rows()
    for workflow in ("Voting", "OrchWorkers"):
        assert amplification.sweep_table(rows, workflow) in records, workflow
    assert capture.capture_table(capture.read_rows()) in records


def test_a_long_run_stopped_after_a_checkpoint_is_read_from_it(tmp_path):
    """The long run may be cut at the session's end: its newest checkpoint holds what it logged."""
    history = [
        {
            "step": step,
            "workflow/success": 0.25 * step,
            "role/generator/update_chi_square": 0.01 * step,
            "role/aggregator/update_chi_square": 0.001,
            **({"alarm/aggregator/entropy_rise": 1.0} if step == 3 else {}),
        }
        for step in (1, 2, 3, 4)
    ]
    run = voting_run(tmp_path / "long", 8, "mini_batches", 1, [])
    checkpoint = write_run(
        run / "checkpoint-4",
        workflow={"workflow": "Voting", "n_voters": 8},
        roles=["generator", "aggregator"],
        sharing="isolated",
        history=history,
        update_schedule="mini_batches",
        seed=1,
    )
    for name in ("trainer_state.json", "multiagent_config.json", "training_args.bin"):
        (run / name).unlink()
    rows = amplification.read_rows(amplification.collect([], [tmp_path / "long"], tmp_path / "long.csv"))
    assert checkpoint.parent == run and {row["steps"] for row in rows} == {4}
    table = amplification.long_table(rows, window=2).splitlines()
    assert table[2].startswith("| 1-2 | 0.38 | 0.015 | 0.001 |") and table[2].endswith("| - |")
    assert table[3].startswith("| 3-4 | 0.88 | 0.035 |") and table[3].endswith("| aggregator: entropy_rise at 3 |")
