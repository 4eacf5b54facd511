"""fp32 LoRA weights on a bf16 base under bf16 autocast: the LoRA layers skip PEFT's cast of their input to fp32,
which autocast undid anyway; the products, gradients and the step's update are the same, and the weights (with their
optimizer state) stay fp32."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from scripted import addition_dataset
from tiny import random_answers, tiny_trainer
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

import trl_multiagent.trainer.parts
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.seams.peft import lora_layers, skip_input_casts_autocast_undoes


class LoraInputCasts(TorchDispatchMode):
    """Counts the bf16 -> fp32 copies made inside the forwards of ``model``'s LoRA layers."""

    def __init__(self, model):
        super().__init__()
        self.count, self.depth = 0, 0
        self.hooks = []
        for layer in lora_layers(model):
            self.hooks.append(layer.register_forward_pre_hook(lambda *args: self.enter(1)))
            self.hooks.append(layer.register_forward_hook(lambda *args: self.enter(-1)))

    def enter(self, step: int) -> None:
        self.depth += step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            self.depth
            and func is torch.ops.aten._to_copy.default
            and kwargs.get("dtype") == torch.float32
            and args[0].dtype == torch.bfloat16
        ):
            self.count += 1
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)


def bf16_model_with_fp32_lora(model_dir):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    with torch.no_grad():  # B starts at zero: give the products (and A's gradients) a value
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    return model


def forward_backward(model, input_ids, *, autocast: bool):
    model.zero_grad()
    with LoraInputCasts(model) as casts, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(input_ids=input_ids).logits.float().logsumexp(-1).mean().backward()
    return casts.count, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_lora_layers_skip_the_input_casts_autocast_undoes(tiny_model_dir):
    model = bf16_model_with_fp32_lora(tiny_model_dir)
    plain = copy.deepcopy(model)
    skip_input_casts_autocast_undoes(model)
    input_ids = torch.randint(0, 300, (4, 40), generator=torch.Generator().manual_seed(1))

    casts_before, grads_before = forward_backward(plain, input_ids, autocast=True)
    casts_after, grads_after = forward_backward(model, input_ids, autocast=True)
    assert casts_before == len(lora_layers(model)) and casts_after == 0  # one per layer and forward, before
    assert grads_after.keys() == grads_before.keys() and all(
        torch.equal(grads_after[n], grads_before[n]) for n in grads_before
    )
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}

    # Without autocast the fp32 weights need the cast: PEFT's runs as before.
    casts_plain, grads_plain = forward_backward(plain, input_ids, autocast=False)
    casts_kept, grads_kept = forward_backward(model, input_ids, autocast=False)
    assert casts_kept == casts_plain > 0
    assert all(torch.equal(grads_kept[n], grads_plain[n]) for n in grads_plain)


def test_a_bf16_training_step_updates_as_with_peft_casts(tiny_model_dir, tmp_path, monkeypatch):
    """One training step of a bf16 base under bf16 autocast, with and without the casts: the same update."""
    settings = dict(
        bf16=True,
        model_init_kwargs={"dtype": "bfloat16"},
        per_device_train_batch_size=8,
        max_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        policy_sharing="isolated",
        seed=0,
    )

    def one_step(output_dir):
        trainer = tiny_trainer(
            tiny_model_dir, output_dir, dataset=addition_dataset(4), respond=random_answers, **settings
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
        trainer.train()
        return trainer, before

    ours, before = one_step(tmp_path / "ours")
    monkeypatch.setattr(trl_multiagent.trainer.parts, "skip_input_casts_autocast_undoes", lambda model: None)
    peft_casts, _ = one_step(tmp_path / "peft")
    assert ours.model.get_base_model().dtype == torch.bfloat16
    assert {p.dtype for n, p in ours.model.named_parameters() if "lora_" in n} == {torch.float32}
    for role in ("generator", "aggregator"):
        a = {n: p.detach() for n, p in adapter_parameters(ours.model, role).items()}
        b = {n: p.detach() for n, p in adapter_parameters(peft_casts.model, role).items()}
        update = sum(float((a[n] - before[n]).pow(2).sum()) for n in a) ** 0.5
        gap = sum(float((a[n] - b[n]).pow(2).sum()) for n in a) ** 0.5
        assert update > 0 and gap / update == pytest.approx(0.0, abs=1e-3), (role, gap / update)
