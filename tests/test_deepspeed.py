"""DeepSpeed ZeRO-2, single process on the CPU accelerator: a workflow trains through the DeepSpeed engine.

Multi-process DeepSpeed does not run on CPU here (ranks disagree on world size); multi-GPU ZeRO needs a GPU machine.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
pytest.importorskip("deepspeed", reason="install the test extras: pip install -e '.[test]'")


def test_zero2_single_process_trains_two_steps(tiny_model_dir, tmp_path):
    launcher = shutil.which("deepspeed", path=os.path.dirname(sys.executable))
    env = {
        **os.environ,
        "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"),
    }
    command = [launcher, "--num_gpus", "1", "--master_port", "29531", str(TESTS / "workers" / "zero2_worker.py"),
               tiny_model_dir, str(tmp_path), str(TESTS / "fixtures" / "zero2.json")]  # fmt: skip
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outcome = json.loads((tmp_path / "result.json").read_text())
    assert outcome["engine"] == "DeepSpeedEngine" and outcome["zero_stage"] == 2
    assert outcome["steps"] == 2 and all(math.isfinite(x) for x in outcome["losses"])
    assert set(outcome["moved"]) == {"generator", "aggregator"}
