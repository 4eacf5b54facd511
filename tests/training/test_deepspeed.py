"""DeepSpeed ZeRO-2 and ZeRO-3, single process on the CPU accelerator: a workflow trains through the DeepSpeed
engine, and under ZeRO-3's parameter partitioning the per-sample adapter routing still moves every role adapter.

Two CPU processes under ZeRO-2 and ZeRO-3 (two machine ranks of `accelerate launch`): tests/training/test_multinode.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys

import pytest
from harness import TESTS, run_offline

pytest.importorskip("deepspeed", reason="install the test extras: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def extensions_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("torch_extensions"))  # DeepSpeed's CPU ops compile once per module


@pytest.mark.slow
@pytest.mark.parametrize("stage, sharing", [(2, "isolated"), (3, "isolated"), (3, "shared")])
def test_zero_single_process_trains_every_adapter(tiny_model_dir, tmp_path, extensions_dir, stage, sharing):
    launcher = shutil.which("deepspeed", path=os.path.dirname(sys.executable))
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": extensions_dir}
    command = [
        launcher,
        "--num_gpus",
        "1",
        "--master_port",
        "29531",
        str(TESTS / "workers" / "deepspeed_worker.py"),
        tiny_model_dir,
        str(tmp_path),
        str(TESTS / "fixtures" / f"zero{stage}.json"),
        sharing,
    ]
    run_offline(command, cwd=tmp_path, env=env, timeout=900)
    outcome = json.loads((tmp_path / "result.json").read_text())
    assert outcome["engine"] == "DeepSpeedEngine" and outcome["zero_stage"] == stage
    assert outcome["steps"] == 2 and all(math.isfinite(x) for x in outcome["losses"])
    expected = {"shared"} if sharing == "shared" else {"generator", "aggregator"}
    assert set(outcome["moved"]) == expected and all(moved > 0 for moved in outcome["moved"].values())
