"""A training run killed with SIGKILL after a checkpoint, as a preempted job is, then resumed from it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import TESTS, launch_offline
from safetensors.torch import load_file


def launch_worker(script: str, *args: str, log: str) -> subprocess.Popen:
    """Start ``tests/workers/<script>`` with ``args``, its output into the file ``log``."""
    return launch_offline([sys.executable, str(TESTS / "workers" / script), *args], log=log)


def assert_resume_after_sigkill_matches(
    launch: Callable[..., subprocess.Popen], root: Path, adapters: tuple[str, ...], kill_after: int = 4, steps: int = 8
) -> None:
    """``launch(output_dir[, checkpoint])`` starts a run of ``steps`` steps that checkpoints every ``kill_after`` and
    writes ``losses.json`` and ``final/<adapter>/`` at the end. One run goes uninterrupted; another is killed once its
    checkpoint exists and resumed from it: the resumed steps' losses and the final adapters must match."""
    full, killed = root / "full", root / "killed"
    assert launch(str(full)).wait(timeout=600) == 0, tail(full)
    expected = json.loads((full / "losses.json").read_text())

    victim = launch(str(killed))
    checkpoint = killed / f"checkpoint-{kill_after}"
    deadline = time.monotonic() + 600  # only so that a run that never checkpoints fails instead of hanging
    while not (checkpoint / "trainer_state.json").is_file():
        assert victim.poll() is None, f"the run ended before its step-{kill_after} checkpoint"
        assert time.monotonic() < deadline, tail(killed)
        time.sleep(0.05)
    time.sleep(0.2)  # let the checkpoint's last files land, as a preemption usually does
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert not (killed / "losses.json").exists()  # it really died mid-run

    assert launch(str(killed), str(checkpoint)).wait(timeout=600) == 0, tail(killed)
    actual = json.loads((killed / "losses.json").read_text())
    assert sorted(actual, key=int) == [str(s) for s in range(1, steps + 1)]
    resumed_steps = [str(s) for s in range(kill_after + 1, steps + 1)]
    assert any(abs(expected[s]) > 1e-6 for s in resumed_steps)  # losses carry signal, so equality means something
    for step in resumed_steps:
        assert abs(actual[step] - expected[step]) < 1e-5, (step, actual[step], expected[step])
    for adapter in adapters:  # and the same adapters at the end
        a = load_file(full / "final" / adapter / "adapter_model.safetensors")
        b = load_file(killed / "final" / adapter / "adapter_model.safetensors")
        assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def tail(output_dir: Path) -> str:
    return Path(f"{output_dir}.log").read_text()[-3000:]
