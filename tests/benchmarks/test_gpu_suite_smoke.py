"""benchmarks/gpu_suite.py --cpu-smoke: every section's code path at tiny size, as CI runs it (the GPU figures come
from the same code on a GPU: docs/benchmarks.md)."""

from __future__ import annotations

import json
import sys

import pytest
from harness import ROOT, run_offline


@pytest.mark.slow
def test_every_section_runs_and_writes_its_figures(tmp_path):
    command = [sys.executable, "gpu_suite.py", "--cpu-smoke", "--steps", "2", "--episodes", "2"]
    command += ["--max-iterations", "2", "--results-dir", str(tmp_path)]
    run_offline(command, cwd=ROOT / "benchmarks", timeout=600)
    (results,) = tmp_path.glob("gpu_suite-*.json")
    sections = json.loads(results.read_text())["sections"]
    assert not [name for name, figures in sections.items() if "error" in figures]
    training = sections["training"]
    assert training["first_step"]["samples"] == 2 * 4  # 2 episodes x (2 generator + 2 evaluator calls)
    assert len(training["warm_steps"]) == 1 and training["warm_mean"]["mfu_measured_peak"] > 0
    assert sections["memory"]["tokens"] == 640  # 10 samples x 64 tokens: the smoke run's token bound, exactly
    decode = sections["decode"]
    assert decode["ratio_plain_over_ours"] > 0
    # Mixed adapters: PEFT's path makes index tensors from Python lists in every layer, ours once per batch.
    assert decode["tensors_from_python_data"]["ours"] < decode["tensors_from_python_data"]["plain"]
    assert results.with_suffix(".md").exists()
