"""Every role served by its own, current adapter: the backends' provenance stamps, the trainer's check of them per
call, the sampler-gap arithmetic and the `adapter_mismatch` alarm. vLLM's side: test_vllm_adapter_check.py."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from scripted import ScriptedBackend
from tiny import half_right_answers, tiny_trainer
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import BASE_MODEL
from trl_multiagent.monitoring import RoleDriftCallback
from trl_multiagent.monitoring.adapter_check import (
    AdapterMismatchError,
    gap_outliers,
    provenance_mismatches,
    sampler_gap_metrics,
    sampler_gap_sums,
)
from trl_multiagent.rollout.backends.base import Provenance
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend
from trl_multiagent.rollout.records import ModelCall

SETTINGS = dict(logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0, policy_sharing="isolated")


def recorded_calls(trainer) -> list[tuple[int, list[ModelCall]]]:
    """(global_step, calls) of every rollout the trainer runs."""
    seen, run = [], trainer.engine.run

    def recording(prompts, on_episode_end=None):
        episodes = run(prompts, on_episode_end)
        seen.append((trainer.state.global_step, [c for e in episodes for c in e.calls]))
        return episodes

    trainer.engine.run = recording
    return seen


def alarms(trainer) -> list[tuple[int, str]]:
    (drift,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, RoleDriftCallback)]
    return [(a.step, a.role) for a in drift.alarms if a.kind == "adapter_mismatch"]


def call(role: str, provenance: Provenance | None) -> ModelCall:
    return ModelCall(role, 0, role, [], [1], [2], "x", False, provenance=provenance)


def test_transformers_backend_stamps_the_live_step_and_the_check_passes(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(max_iterations=2), max_steps=2, **SETTINGS)
    assert isinstance(trainer.rollout_backend, TransformersBackend)
    seen = recorded_calls(trainer)
    trainer.train()

    assert [step for step, _ in seen] == [0, 1]
    for step, calls in seen:
        assert calls and {c.provenance for c in calls} <= {
            Provenance(trainer.role_adapters[r], step, "transformers") for r in ("generator", "evaluator")
        }
        assert {c.provenance.adapter for c in calls if c.role == "evaluator"} == {trainer.role_adapters["evaluator"]}
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["role/generator/adapter_mismatch"] for h in logs] == [0.0, 0.0]
    assert "role/generator/sampler_gap_mean" not in logs[0]  # transformers reports no sampling log-probs
    assert alarms(trainer) == []


class FrozenClock(TransformersBackend):
    """A backend that generates from the live model but stamps the version the weights had at the first step: what
    a generation engine holding a copy of the weights, never updated, would report."""

    def __init__(self, backend: TransformersBackend):
        self.__dict__.update(backend.__dict__)
        self.weights_step = lambda: 0


@pytest.mark.parametrize("fail", [False, True])
def test_a_stale_stamp_raises_the_alarm_or_stops_training(tiny_model_dir, tmp_path, fail):
    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, EvalOpt(max_iterations=2), max_steps=3, fail_on_adapter_mismatch=fail, **SETTINGS
    )
    trainer.engine.backend = trainer.rollout_backend = FrozenClock(trainer.rollout_backend)
    if fail:
        expected = "role 'generator' should be served by adapter 'generator' at version 1, but its calls were served "
        with pytest.raises(AdapterMismatchError, match=expected + "by adapter 'generator' at version 0"):
            trainer.train()
        assert trainer.state.global_step == 1  # stopped in the rollout of step 2, before training on it
        return
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["role/evaluator/adapter_mismatch"] for h in logs] == [0.0, 1.0, 1.0]
    # Logged with the step that trained on the stale samples (the second); once per role until a clean batch.
    assert sorted(alarms(trainer)) == [(2, "evaluator"), (2, "generator")]
    assert logs[1]["alarm/generator/adapter_mismatch"] == 1.0


class StampingScripted(ScriptedBackend):
    """Scripted rollouts from a backend that keeps copies of the adapters: each sync records the step it loaded, each
    call is stamped with the version loaded when it was made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trainer, self.loaded = None, None

    def sync_adapters(self, model, names=None) -> None:
        self.loaded = self.trainer.state.global_step

    def generate(self, requests):
        results = super().generate(requests)
        for request, result in zip(requests, results):
            result.provenance = Provenance(request.adapter, self.loaded, "scripted")
        return results


def test_batches_rolled_out_ahead_are_expected_one_step_old(tiny_model_dir, tmp_path):
    backend = StampingScripted(AutoTokenizer.from_pretrained(tiny_model_dir), half_right_answers)
    ahead = dict(backend=backend, rollout_backend="vllm", rollout_ahead=1, vllm_importance_sampling_correction=True)
    workflow = EvalOpt(max_iterations=2)
    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, workflow, max_steps=3, fail_on_adapter_mismatch=True, **ahead, **SETTINGS
    )
    backend.trainer = trainer
    seen = recorded_calls(trainer)
    trainer.train()  # no AdapterMismatchError: batch 0 ran on the spot (v0), batches 1 and 2 ahead (v0, v1)
    assert [{c.provenance.version for c in calls} for _, calls in seen] == [{0}, {0}, {1}]
    assert [h["role/generator/adapter_mismatch"] for h in trainer.state.log_history if "loss" in h] == [0.0] * 3


def test_provenance_mismatches_name_the_role_and_both_versions():
    adapters = {"generator": "generator", "evaluator": "evaluator", "judge": BASE_MODEL}
    calls = [
        call("generator", Provenance("generator", 4, "vllm-colocate")),
        call("evaluator", Provenance("evaluator", 3, "vllm-colocate")),  # missed the last sync
        call("evaluator", Provenance("generator", 4, "vllm-colocate")),
        call("judge", Provenance(BASE_MODEL, None, "vllm-colocate")),  # the base model has no version
        call("generator", None),  # a backend that does not stamp is not checked
    ]
    found = provenance_mismatches(calls, adapters, version=4, step=4)
    assert list(found) == ["evaluator"]
    assert "'evaluator' at version 4" in found["evaluator"].message
    assert "adapter 'evaluator' at version 3 (vllm-colocate)" in found["evaluator"].message
    swapped = provenance_mismatches([call("evaluator", Provenance("generator", 4, "vllm-server"))], adapters, 4, 4)
    assert "served by adapter 'generator' at version 4" in swapped["evaluator"].message


def test_sampler_gap_per_role():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0], [-0.5, -0.5, -0.5]])
    sampler = torch.tensor([[-1.0, -2.5, 9.0], [-1.5, -0.5, 0.0], [-0.5, float("nan"), -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]])
    sums, largest = sampler_gap_sums(["a", "b", "c"], ["a", "b", "a"], trainer, sampler, mask)
    metrics = sampler_gap_metrics(["a", "b", "c"], sums, largest)
    assert metrics["role/a/sampler_gap_mean"] == pytest.approx(0.5 / 5)  # the masked 9.0 and the NaN count as none
    assert metrics["role/a/sampler_gap_max"] == pytest.approx(0.5)
    ratios = [math.exp(0.5 / 2), 1.0]  # sequence level: exp(mean gap over the sequence's tokens)
    assert metrics["role/a/sampler_ratio_std"] == pytest.approx(statistics.pstdev(ratios), rel=1e-9)
    assert metrics["role/b/sampler_gap_mean"] == pytest.approx(0.5) and metrics["role/b/sampler_ratio_std"] == 0.0
    assert "role/c/sampler_gap_mean" not in metrics  # no calls, nothing logged


def test_gap_limits_fixed_and_relative():
    assert gap_outliers({"a": 5e-7, "b": 4e-7, "c": 0.05}, 0.03, 10.0, 1e-5) == {"c": 0.03}
    assert gap_outliers({"a": 5e-7, "b": 4e-7, "c": 1e-4}, 0.03, 10.0, 1e-5) == {"c": 1e-5}  # far above the others
    assert gap_outliers({"a": 5e-7, "b": 4e-7, "c": 3e-6}, 0.03, 10.0, 1e-5) == {}  # 7x, and within the noise
    assert gap_outliers({"a": 0.006, "b": 0.005}, 0.03, 10.0, 1e-2) == {}  # bf16 noise
    assert gap_outliers({"a": 0.1}, 0.03, 10.0, 1e-2) == {"a": 0.03}  # one role: the fixed limit alone


def test_bad_limits_fail_at_start(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="adapter_mismatch_outlier"):
        tiny_trainer(tiny_model_dir, tmp_path, max_steps=1, adapter_mismatch_outlier=0.5, **SETTINGS)
    with pytest.raises(ValueError, match="adapter_mismatch_gap"):
        tiny_trainer(tiny_model_dir, tmp_path, max_steps=1, adapter_mismatch_gap=0.0, **SETTINGS)
