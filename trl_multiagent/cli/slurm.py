"""The grid on a SLURM cluster, through `submitit`: one job array of trainings, each evaluation a job that waits for
the trainings it reads, and trainings that resume from their last checkpoint when SLURM preempts or times them out.

Install with ``pip install -e '.[slurm]'`` in the clone (or ``pip install submitit``). `recipes/grid.py --launcher
slurm` builds the jobs; the jobs themselves (``CellTraining``, ``GridEvaluation``) are here, in the package, so that
every node imports them.

A training job runs one task per node (``srun``, which submitit writes into the job script); each task starts
`accelerate launch` for its node, with the machine count, its rank and the address of the first node read from the
job's SLURM environment (submitit's ``JobEnvironment``: ``SLURM_JOB_NODELIST``, ``SLURM_NODEID``, ...).
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoints.atomic import newest_complete_checkpoint

FINISHED = "multiagent_config.json"  # written by the trainer's final save: the training finished


def require_submitit() -> Any:
    try:
        import submitit
    except ImportError as error:
        raise ImportError(
            "The SLURM launcher needs submitit: pip install submitit (the clone's extra: pip install -e '.[slurm]')."
        ) from error
    return submitit


def last_complete_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest ``checkpoint-N`` of ``run_dir`` whose save finished (``checkpoints.atomic``); None if none."""
    newest, _ = newest_complete_checkpoint(run_dir)
    return None if newest is None else Path(newest)


def node_topology(nodes: int, processes_per_node: int, port: int, environment: Any) -> list[str]:
    """The `accelerate launch` flags of this node: how many machines and processes in all, this node's rank and the
    first node's address; ``environment`` is submitit's ``JobEnvironment`` (read from SLURM's variables)."""
    if environment.num_nodes != nodes:
        raise RuntimeError(
            f"The job has {environment.num_nodes} nodes, the grid asked for {nodes}: submit it with --nodes_per_run "
            f"{environment.num_nodes}, or check the partition's node limit."
        )
    flags = ["--num_processes", str(nodes * processes_per_node)]
    if nodes > 1:
        flags += [
            "--num_machines",
            str(nodes),
            "--machine_rank",
            str(environment.node),
            "--main_process_ip",
            environment.hostnames[0],
            "--main_process_port",
            str(port),
            "--rdzv_backend",
            "static",
            "--same_network",
        ]
    return flags


@dataclass
class CellTraining:
    """One grid cell's training, run by every task (one per node) of its job.

    ``launcher`` is the `accelerate launch` command up to its flags (``[python, -m, accelerate.commands.launch,
    --config_file, X]``), ``script`` the recipe and its arguments; the node's topology flags go between. A run
    whose final save exists is not run again; one with checkpoints resumes from the newest complete one.
    """

    launcher: list[str]
    script: list[str]
    run_dir: str
    nodes: int = 1
    processes_per_node: int = 1
    port: int = 29500

    def command(self, environment: Any) -> list[str]:
        flags = node_topology(self.nodes, self.processes_per_node, self.port, environment)
        resume = last_complete_checkpoint(self.run_dir)
        return [*self.launcher, *flags, *self.script, *(["--resume_from_checkpoint", str(resume)] if resume else [])]

    def __call__(self) -> str:
        if (Path(self.run_dir) / FINISHED).is_file():
            return f"{self.run_dir}: finished before"
        submitit = require_submitit()
        command = self.command(submitit.JobEnvironment())
        print(f"$ {shlex.join(command)}", flush=True)
        subprocess.run(command, check=True)
        return f"{self.run_dir}: trained"

    def checkpoint(self) -> Any:
        """Called by submitit when SLURM preempts or times out the job: requeue it; the next start resumes from the
        newest complete checkpoint (``command``)."""
        return require_submitit().helpers.DelayedSubmission(self)


def evaluation_marker(folder: str | Path, command: list[str]) -> Path:
    """The file that records that ``command`` (an evaluation of the grid) finished."""
    digest = hashlib.sha256(shlex.join(command).encode()).hexdigest()[:16]
    return Path(folder) / "finished_evaluations" / digest


@dataclass
class GridEvaluation:
    """One evaluation of the grid (``recipes/evaluate.py ...``); on success it leaves ``marker``, so a resubmitted
    grid skips it. `evaluate.py` itself skips checkpoints already evaluated, so a requeued evaluation continues."""

    command: list[str]
    marker: str

    def __call__(self) -> str:
        print(f"$ {shlex.join(self.command)}", flush=True)
        subprocess.run(self.command, check=True)
        Path(self.marker).parent.mkdir(parents=True, exist_ok=True)
        Path(self.marker).write_text(shlex.join(self.command) + "\n")
        return self.marker

    def checkpoint(self) -> Any:
        return require_submitit().helpers.DelayedSubmission(self)
