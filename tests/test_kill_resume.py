"""A run killed with SIGKILL after its step-4 checkpoint resumes to step 8 with the uninterrupted run's losses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

TESTS = Path(__file__).parent


def launch(*args: str) -> subprocess.Popen:
    path = f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    log = open(f"{args[1]}.log", "w")  # a file, not a pipe: a full pipe would block the child
    command = [sys.executable, str(TESTS / "workers" / "kill_worker.py"), *args]
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def tail(path) -> str:
    return Path(f"{path}.log").read_text()[-3000:]


def test_sigkill_after_checkpoint_then_resume_matches(tiny_model_dir, tmp_path):
    full = launch(tiny_model_dir, str(tmp_path / "full"))
    assert full.wait(timeout=600) == 0, tail(tmp_path / "full")
    expected = json.loads((tmp_path / "full" / "losses.json").read_text())

    killed_dir = tmp_path / "killed"
    victim = launch(tiny_model_dir, str(killed_dir))
    checkpoint = killed_dir / "checkpoint-4"
    deadline = time.monotonic() + 600
    while not (checkpoint / "trainer_state.json").is_file():
        assert victim.poll() is None, "the run ended before its step-4 checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)  # let the checkpoint's last files land, as a preemption usually does
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert not (killed_dir / "losses.json").exists()  # it really died mid-run

    resumed = launch(tiny_model_dir, str(killed_dir), str(checkpoint))
    assert resumed.wait(timeout=600) == 0, tail(killed_dir)
    actual = json.loads((killed_dir / "losses.json").read_text())
    assert sorted(actual, key=int) == [str(s) for s in range(1, 9)]
    assert any(abs(expected[s]) > 1e-6 for s in expected)  # losses carry signal, so equality means something
    for step in map(str, range(5, 9)):
        assert abs(actual[step] - expected[step]) < 1e-5, (step, actual[step], expected[step])
    for role in ("generator", "aggregator"):  # and the same adapters at the end
        a = load_file(tmp_path / "full" / "final" / role / "adapter_model.safetensors")
        b = load_file(killed_dir / "final" / role / "adapter_model.safetensors")
        assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
