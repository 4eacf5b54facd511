"""`use_liger_kernel`: Liger's layer kernels go into every base model (the trainer's and each of `role_models`) before
its adapters wrap its layers; where they cannot run (no liger-kernel, no Triton, no GPU) the trainer and `--validate`
refuse it, saying why. Liger's kernels need a GPU: here its patch function is observed, not run."""

from __future__ import annotations

import runpy
import sys
import types

import pytest
from harness import ROOT
from scripted import addition_dataset
from tiny import tiny_config, tiny_lora, tiny_trainer

import trl_multiagent.config.multiagent_grpo_config
import trl_multiagent.seams.liger
from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer, Voting
from trl_multiagent.seams.liger import liger_kernel_unavailable


def liger_trainer(model_dir, tmp_path, **settings):
    return MultiAgentGRPOTrainer(
        model=model_dir,
        workflow=Voting(),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=tiny_config(tmp_path, use_liger_kernel=True, **settings),
        train_dataset=addition_dataset(),
        peft_config=tiny_lora(),
    )


def test_use_liger_kernel_is_refused_where_it_cannot_run(tiny_model_dir, tmp_path, monkeypatch, capsys):
    # This machine has no liger-kernel: the refusal names the install.
    with pytest.raises(ValueError, match=r"`use_liger_kernel=True` cannot run here: .*`pip install liger-kernel`"):
        liger_trainer(tiny_model_dir, tmp_path)
    argv = ["recipes/voting_math.py", "--config", "toy", "--use_liger_kernel", "true", "--validate"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "recipes" / "voting_math.py"), run_name="__main__")
    assert stop.value.code == 1 and "pip install liger-kernel" in capsys.readouterr().err

    # Installed with Triton, but the run is on CPU: refused for want of a GPU.
    installed = types.SimpleNamespace(util=types.SimpleNamespace(find_spec=lambda name: object()))
    monkeypatch.setattr(trl_multiagent.seams.liger, "importlib", installed)
    assert "CUDA GPU" in liger_kernel_unavailable(use_cpu=True)
    with pytest.raises(ValueError, match="run on a CUDA GPU"):
        liger_trainer(tiny_model_dir, tmp_path)


@pytest.fixture
def observed_liger(monkeypatch) -> list[dict]:
    """Liger as if installed and runnable: its patch function records each model it is given, and whether that model
    carried LoRA layers yet."""
    calls = []

    def patch(model, **kwargs):
        has_lora = any("lora_" in name for name, _ in model.named_parameters())
        calls.append({"model": model, "kwargs": kwargs, "had_adapters": has_lora})

    module = types.ModuleType("liger_kernel.transformers")
    module._apply_liger_kernel_to_instance = patch
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", module)
    monkeypatch.setattr(trl_multiagent.config.multiagent_grpo_config, "liger_kernel_unavailable", lambda use_cpu: None)
    return calls


def test_liger_patches_every_base_model_before_its_adapters(tiny_model_dir, tiny_judge_dir, tmp_path, observed_liger):
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        policy_sharing="isolated",
        role_models={"evaluator": tiny_judge_dir},
        use_liger_kernel=True,
        liger_kernel_config={"rope": False},
    )
    patched = [call["model"] for call in observed_liger]
    judge = trainer.bases.extra[tiny_judge_dir].model
    assert patched == [trainer.model.get_base_model(), judge.get_base_model()]  # each base once, this one first
    assert not any(call["had_adapters"] for call in observed_liger)
    for call in observed_liger:  # the user's choice of layer kernels; Liger's loss kernels stay off, as in TRL
        assert call["kwargs"] == {"rope": False, "fused_linear_cross_entropy": False, "cross_entropy": False}


def test_liger_loss_kernels_are_refused(tiny_model_dir, tmp_path, observed_liger):
    with pytest.raises(ValueError, match=r"turns on \['fused_linear_cross_entropy'\]"):
        liger_trainer(tiny_model_dir, tmp_path, liger_kernel_config={"fused_linear_cross_entropy": True})
    assert observed_liger == []
