"""benchmarks/gpu_suite.py --cpu-smoke: every section's code path at tiny size, as CI runs it (the GPU figures come
from the same code on a GPU: docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from harness import ROOT, offline_env, run_offline


@pytest.mark.slow
def test_every_section_runs_and_writes_its_figures(tmp_path):
    command = [sys.executable, "gpu_suite.py", "--cpu-smoke", "--steps", "3", "--episodes", "2", "--profile"]
    command += ["--max-iterations", "2", "--results-dir", str(tmp_path)]
    done = run_offline(command, cwd=ROOT / "benchmarks", timeout=900)
    assert 0 <= done.stdout.find("== plan") < done.stdout.find("== peak")  # the plan comes before any work
    (results,) = tmp_path.glob("gpu_suite-*.json")
    results = json.loads(results.read_text())
    sections = results["sections"]
    assert not [name for name, figures in sections.items() if "error" in figures]
    assert list(sections) == ["peak", "training", "micro_batch", "decode", "vllm"]

    digest = run_offline([sys.executable, "gpu_suite.py", "--digest"], cwd=ROOT / "benchmarks", timeout=120)
    assert results["machine"]["source_digest"] == digest.stdout.split()[-1]
    assert results["machine"]["commit"]
    # The CPU is in no datasheet: MFU is given against the measured peak alone, and the run says why.
    assert results["peaks"]["datasheet_tflops"] is None and "measured" in results["peaks"]["datasheet"]

    training = sections["training"]
    assert training["first_step"]["samples"] == 2 * 4  # 2 episodes x (2 generator + 2 evaluator calls)
    assert len(training["warm_steps"]) == 2 and training["warm_summary"]["steps"] == 2
    warm = training["warm_steps"][0]
    assert warm["mfu_measured_peak"] > 0 and warm["mfu_datasheet"] is None
    # Padding, recompute and the log-prob forward before the update are executed, not model, FLOPs.
    assert warm["executed_over_model_flops"] > 1 and warm["hfu_measured_peak"] > warm["mfu_measured_peak"]
    waste = warm["waste_tflop"]
    assert waste["extra_forwards"] > 0 and waste["recompute"] > 0
    # Rows grouped by length, one sample a row: a forward may carry no padding at all (a padded forward's count is
    # checked exactly in test_executed_work.py).
    assert waste["padding_in_linear_layers"] >= 0
    loss = warm["phases"]["loss_forward"]
    assert loss["recomputed_layers"] > 0  # gradient checkpointing ran (the paper preset's)
    assert sum(loss["forward_shapes"].values()) == loss["forwards"] > 0
    assert loss["real_tokens"] == warm["tokens"] and loss["sum_squared_sample_lengths"] > 0
    assert sum(loss["attention_kernels"].values()) == loss["forwards"]
    assert training["lora_dtypes"] == ["float32"]

    micro_batch = sections["micro_batch"]
    assert micro_batch["tokens"] == 640  # 10 samples x 64 tokens: the smoke run's token bound, exactly
    assert len(micro_batch["repeats"]) == 5 and micro_batch["summary"]["steps"] == 5
    forward = micro_batch["phases"]["loss_forward"]
    assert forward["padded_tokens"] == 0 and list(forward["attention_masks"]) == ["none (causal kernel)"]
    groups = micro_batch["kernel_groups"]
    assert groups["gemm_s"] > 0 and groups["lora_s"] > 0 and groups["attention_s"] > 0 and groups["lm_head_s"] > 0
    assert sum(groups["shares"].values()) == pytest.approx(1, abs=1e-3)

    decode = sections["decode"]
    assert set(decode["tokens_per_call"]) == {"ours", "ours_base", "plain", "static_compiled", "continuous"}
    assert set(decode["tokens_per_call"].values()) == {4 * 8}  # the same requests, the same tokens, every path
    assert decode["compiled_graphs"] > 0  # the static-cache path went through torch.compile
    assert decode["fastest_other"] in ("plain", "static_compiled", "continuous") and decode["ours_over_fastest"] > 0
    assert all(len(rates) == 3 for rates in decode["tokens_per_s"].values())

    if importlib.util.find_spec("vllm") is None:
        assert sections["vllm"] == {"skipped": "vLLM is not installed", "section_s": sections["vllm"]["section_s"]}
    else:
        assert set(sections["vllm"]["vllm_over_transformers"]) == {"4", "8"}


@pytest.mark.slow
def test_a_decode_path_that_cannot_run_is_reported_and_the_others_measured(tmp_path):
    command = [sys.executable, "gpu_suite.py", "--cpu-smoke", "--sections", "decode", "--results-dir", str(tmp_path)]
    command += ["--compile-backend", "no_such_backend"]
    folder = ROOT / "benchmarks"
    done = subprocess.run(command, cwd=folder, env=offline_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert "failed: ['decode (static_compiled)']" in done.stdout
    (results,) = tmp_path.glob("gpu_suite-*.json")
    decode = json.loads(results.read_text())["sections"]["decode"]
    assert "no_such_backend" in decode["failed_paths"]["static_compiled"]
    assert set(decode["tokens_per_s_median"]) == {"ours", "ours_base", "plain", "continuous"}
    assert decode["ours_over_fastest"] > 0
