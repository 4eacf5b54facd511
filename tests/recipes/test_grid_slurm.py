"""The grid through submitit (`--launcher slurm`): the job script and the per-node `accelerate launch` of a
multi-node training, resuming from the newest complete checkpoint, and the whole toy grid through submitit's local
executor, resubmitted once finished without running anything again."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys

import pytest
from harness import ROOT, run_offline

submitit = pytest.importorskip("submitit", reason="install the slurm extra: pip install -e '.[slurm]'")

from trl_multiagent.cli.slurm import CellTraining, last_complete_checkpoint  # noqa: E402
from trl_multiagent.evaluation import read_results  # noqa: E402


def load_grid():
    spec = importlib.util.spec_from_file_location("grid_recipe", ROOT / "recipes" / "grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def two_node_args(grid, tmp_path):
    return grid.GridArguments(
        models=["Qwen/Qwen3-1.7B"],
        tasks=["math"],
        workflows=["voting"],
        policy_sharing=["isolated"],
        output_root=str(tmp_path / "runs"),
        launcher="slurm",
        partition="gpu",
        gpus_per_run=8,
        nodes_per_run=2,
        accelerate_config="accelerate_configs/multi_node.yaml",
        main_process_port=29611,
    )


def test_multi_node_job_runs_one_accelerate_launch_per_node(tmp_path, monkeypatch):
    grid = load_grid()
    args = two_node_args(grid, tmp_path)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\n")  # submitit's SLURM executor looks for srun before it renders
    (fake_bin / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    executor = grid.executor(args, tmp_path / "slurm", name="grid-train", nodes=2, gpus=8)
    script = executor._executor._make_submission_file_text("python -u -m submitit.core._submit X", "uid")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1440",
    ):
        assert line in script.splitlines(), script
    assert any(line.startswith("srun ") for line in script.splitlines()), script  # one task per node

    cell = next(c for c in grid.grid_cells(args) if c.workflow == "voting")
    job = grid.cell_training(args, cell, grid.train_command(args, cell))
    assert isinstance(job, CellTraining)
    slurm = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "gpu-a[07-08]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
    }
    for node in (0, 1):
        for name, value in {**slurm, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node)}.items():
            monkeypatch.setenv(name, value)
        launch = job.command(submitit.JobEnvironment())
        assert launch[:5] == [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "accelerate_configs" / "multi_node.yaml"),
        ]
        flags = shlex.join(launch)
        assert (
            f"--num_processes 16 --num_machines 2 --machine_rank {node} --main_process_ip gpu-a07 "
            "--main_process_port 29611 --rdzv_backend static --same_network " + str(ROOT / "recipes/voting_math.py")
        ) in flags
        assert f"--output_dir {cell.run_dir} --policy_sharing isolated" in flags
        assert "--resume_from_checkpoint" not in flags

    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")  # a job that got fewer nodes than the grid asked for
    with pytest.raises(RuntimeError, match="has 1 nodes, the grid asked for 2"):
        job.command(submitit.JobEnvironment())


def test_more_gpus_than_the_accelerate_config_starts_is_refused(tmp_path):
    grid = load_grid()
    args = two_node_args(grid, tmp_path)
    args.accelerate_config, args.nodes_per_run = "accelerate_configs/single_gpu.yaml", 1
    cell = grid.grid_cells(args)[0]
    with pytest.raises(ValueError, match="starts one process but a run gets 8 GPUs"):
        grid.cell_training(args, cell, grid.train_command(args, cell))


def test_a_requeued_training_resumes_from_its_newest_complete_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for step, complete in ((1, True), (2, True), (3, False)):  # checkpoint-3: the job was killed while saving it
        (run / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            for name in ("trainer_state.json", "multiagent_config.json"):
                (run / f"checkpoint-{step}" / name).write_text("{}")
    assert last_complete_checkpoint(run) == run / "checkpoint-2"
    job = CellTraining(launcher=["launch"], script=["recipe.py", "--output_dir", str(run)], run_dir=str(run))
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "1")
    command = job.command(submitit.JobEnvironment())
    assert command[-2:] == ["--resume_from_checkpoint", str(run / "checkpoint-2")]
    requeue = job.checkpoint()  # what submitit calls on preemption or timeout
    assert isinstance(requeue, submitit.helpers.DelayedSubmission) and requeue.function is job
    assert last_complete_checkpoint(tmp_path / "nothing") is None


@pytest.mark.slow
def test_toy_grid_through_submitit_local_executor(tmp_path):
    grid_args = [
        sys.executable,
        "recipes/grid.py",
        "--launcher",
        "slurm",
        "--slurm_executor",
        "local",
        "--gpus_per_run",
        "0",
        "--models",
        "toy",
        "--tasks",
        "math",
        "--workflows",
        "voting",
        "--policy_sharing",
        "shared",
        "--accelerate_config",
        "accelerate_configs/cpu.yaml",
        "--recipe_config",
        "math=recipes/configs/toy.yaml",
        "--eval_dataset",
        "math=arithmetic",
        "--max_steps",
        "2",
        "--save_steps",
        "1",
        "--output_root",
        str(tmp_path),
        "--eval_args",
        "--limit 2 --max_completion_length 8",
    ]
    out = run_offline(grid_args, cwd=ROOT, timeout=1800).stdout
    for cell in ("single_agent", "voting-shared"):  # 2 cells, each trained by a job of its own
        assert (tmp_path / "toy" / "math" / cell / "multiagent_config.json").is_file(), out[-3000:]
    table = (tmp_path / "table.md").read_text()
    for row in (
        "| Voting | shared | trained |",
        "| Voting | - | base |",
        "| Voting | isolated | transfer |",
        "| SingleAgent | isolated | trained |",
    ):
        assert row in table, out[-3000:]
    finished = list((tmp_path / "slurm" / "finished_evaluations").iterdir())
    assert len(finished) == 6  # 2 cells, 2 base-model runs, 1 transfer, SA-RL best-of-n (n: Voting's calls)
    job_logs = sorted(p.name for p in (tmp_path / "slurm").iterdir() if p.name.isdigit())
    assert len(job_logs) == 2 + 6
    (best_of,) = [row for row in read_results(tmp_path / "toy" / "math" / "single_agent") if "best_of" in row]
    assert best_of["best_of"] == 4 and best_of["best_of_calls_of"]["workflow"] == "Voting"  # 3 voters, 1 aggregator

    again = run_offline(grid_args, cwd=ROOT, timeout=600).stdout  # resubmitted: nothing left to run
    assert again.count("finished before") == 2 and again.count("skip evaluation (finished)") == 6
    assert sorted(p.name for p in (tmp_path / "slurm").iterdir() if p.name.isdigit()) == job_logs
    assert json.loads((tmp_path / "table.json").read_text())  # the report is rebuilt
