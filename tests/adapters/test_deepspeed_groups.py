"""Adapter updates inside the DeepSpeed engine's optimizer step (adapters/deepspeed_groups.py), on a torch AdamW over a
tiny PEFT model's adapters, stepped as ZeRO steps it: once per param group, that group alone in the optimizer.
The trainings through the engine itself: tests/training/test_deepspeed.py (one process), test_multinode.py (two)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft import get_peft_model
from tiny import tiny_lora
from transformers import AutoModelForCausalLM

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.adapters.deepspeed_groups import ADAPTER_KEY, AdapterGroups, adapter_groups_for, group_by_adapter
from trl_multiagent.adapters.installed import InstalledAdapters
from trl_multiagent.training.mini_batches import check_schedule

ROLE_ADAPTERS = {"generator": "generator", "aggregator": "aggregator"}


@pytest.fixture
def installed(tiny_model_dir) -> InstalledAdapters:
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), tiny_lora())
    return InstalledAdapters(model, ROLE_ADAPTERS)


def owners(installed) -> dict:
    return {p: a for a in installed.adapter_names for p in installed.parameters(a).values()}


def grouped_adamw(installed, no_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW with two groups as the Trainer makes them (weight decay, and ``no_decay``), each holding parameters of
    both adapters, cut per adapter."""
    params = list(owners(installed))
    groups = [{"params": params[::2], "weight_decay": 0.01}, {"params": params[1::2], "weight_decay": no_decay}]
    optimizer = torch.optim.AdamW(groups, lr=0.1)
    group_by_adapter(optimizer, owners(installed))
    return optimizer


def zero_step(optimizer) -> None:
    """A step as ZeRO-2 takes it: the optimizer called once per group, holding only that group."""
    groups = optimizer.param_groups
    for group in groups:
        optimizer.param_groups = [group]
        optimizer.step()
    optimizer.param_groups = groups


def give_gradients(installed, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for param in owners(installed):
        param.grad = torch.randn(param.shape, generator=generator)


def snapshot(installed, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in installed.parameters(adapter).items()}


def test_groups_are_cut_per_adapter_and_equal_settings_join(installed):
    optimizer = grouped_adamw(installed)
    assert [(g[ADAPTER_KEY], g["weight_decay"]) for g in optimizer.param_groups] == [
        ("generator", 0.01),
        ("aggregator", 0.01),
        ("generator", 0.0),
        ("aggregator", 0.0),
    ]
    joined = grouped_adamw(installed, no_decay=0.01)  # both groups alike: one group per adapter
    assert [g[ADAPTER_KEY] for g in joined.param_groups] == ["generator", "aggregator"]
    for adapter in ROLE_ADAPTERS:
        held = {p for g in joined.param_groups if g[ADAPTER_KEY] == adapter for p in g["params"]}
        assert held == set(installed.parameters(adapter).values())


@pytest.mark.parametrize("as_zero", [True, False])
def test_an_adapter_steps_alone_and_the_others_keep_weights_and_optimizer_state(installed, as_zero):
    optimizer = grouped_adamw(installed)
    groups = AdapterGroups(clip_norm=0.0, sum_over_processes=lambda t: t)
    groups.attach(optimizer)
    give_gradients(installed)
    gradients = {p: p.grad for p in installed.parameters("aggregator").values()}
    before = snapshot(installed, "aggregator")
    groups.alone = "generator"
    zero_step(optimizer) if as_zero else optimizer.step()
    assert all(p not in optimizer.state for p in installed.parameters("aggregator").values())  # no moments, no count
    assert all(torch.equal(p, before[n]) for n, p in installed.parameters("aggregator").items())
    assert all(p.grad is gradients[p] for p in gradients)  # given back after the step
    assert all(optimizer.state[p]["step"] == 1 for p in installed.parameters("generator").values())
    groups.alone = "aggregator"  # the next mini-batch's adapter steps on its own gradient
    zero_step(optimizer) if as_zero else optimizer.step()
    assert all(not torch.equal(p, before[n]) for n, p in installed.parameters("aggregator").items() if "lora_B" in n)
    assert all(optimizer.state[p]["step"] == 1 for p in owners(installed))


def test_each_adapter_is_clipped_on_its_own_norm_over_processes(installed):
    optimizer = torch.optim.SGD(list(owners(installed)), lr=1.0)  # a step of lr 1 moves each weight by its gradient
    group_by_adapter(optimizer, owners(installed))
    # Another process holds the other partition of each group, here with the same squares: the norm is sqrt(2) x.
    groups = AdapterGroups(clip_norm=1.0, sum_over_processes=lambda squares: 2 * squares)
    groups.attach(optimizer)
    give_gradients(installed)
    with torch.no_grad():
        for param in installed.parameters("aggregator").values():
            param.grad *= 1e-3  # the aggregator's norm is under the bound: left as it is
    expected, scales = {}, {}
    for adapter in ROLE_ADAPTERS:
        grads = [p.grad for p in installed.parameters(adapter).values()]
        norm = 2**0.5 * torch.nn.utils.get_total_norm(grads)
        scales[adapter] = scale = min(1.0, 1.0 / (norm.item() + 1e-6))
        expected[adapter] = {n: p.detach() - scale * p.grad for n, p in installed.parameters(adapter).items()}
    assert scales["generator"] < 0.1 and scales["aggregator"] == 1.0
    zero_step(optimizer)
    for adapter, weights in expected.items():
        for name, param in installed.parameters(adapter).items():
            torch.testing.assert_close(param.detach(), weights[name], rtol=0, atol=1e-6)


def plugin(**zero) -> SimpleNamespace:
    """accelerate's DeepSpeedPlugin, as far as the groups read it."""
    return SimpleNamespace(deepspeed_config={"zero_optimization": zero})


def settings(**overrides) -> MultiAgentGRPOConfig:
    return MultiAgentGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **overrides)


def groups_for(installed, args, deepspeed_plugin, decay=lambda model: [n for n, _ in model.named_parameters()]):
    return adapter_groups_for(
        args, installed, deepspeed_plugin=deepspeed_plugin, sum_over_processes=lambda t: t, decay_parameter_names=decay
    )


def test_groups_are_made_where_deepspeed_steps_an_adapter_alone_or_clips_each(installed):
    mini_batches, clip_merged = settings(update_schedule="mini_batches"), settings(clip_grad_norm_per_adapter=True)
    assert groups_for(installed, mini_batches, None) is None  # no DeepSpeed: the trainer drops gradients itself
    assert groups_for(installed, settings(), plugin(stage=2)) is None  # merged, one norm: the engine's own step
    assert groups_for(installed, mini_batches, plugin(stage=2)).clip_norm == 0.0  # the engine clips each mini-batch
    assert groups_for(installed, clip_merged, plugin(stage=3)).clip_norm == 1.0


def test_what_each_adapter_clipped_in_the_engine_cannot_do_is_refused_with_the_settings_that_work(installed):
    clip_merged = settings(clip_grad_norm_per_adapter=True, weight_decay=0.01)

    def lora_a_only(model) -> list[str]:  # the adapters' B matrices without weight decay: two groups each
        return [n for n, _ in model.named_parameters() if "lora_A" in n]

    with pytest.raises(ValueError, match="--weight_decay 0, or --update_schedule mini_batches"):
        groups_for(installed, clip_merged, plugin(stage=2), decay=lora_a_only)
    assert groups_for(installed, settings(clip_grad_norm_per_adapter=True), plugin(stage=2), decay=lora_a_only)
    size = sum(p.numel() for p in installed.parameters("generator").values())
    with pytest.raises(ValueError, match=f"Set sub_group_size to at least {size}"):
        groups_for(installed, clip_merged, plugin(stage=3, sub_group_size=size - 1))
    assert groups_for(installed, clip_merged, plugin(stage=3, sub_group_size=size))


def test_deepspeed_optimizers_and_schedulers_of_its_own_are_refused_where_they_would_step_otherwise():
    paper = settings(update_schedule="mini_batches", lr_scheduler_steps="per_update")
    with pytest.raises(ValueError, match="Remove that section: the Trainer's optimizer"):
        check_schedule(paper, deepspeed=True, deepspeed_config={"optimizer": {"type": "AdamW"}})
    with pytest.raises(ValueError, match="Remove that section: the Trainer's scheduler"):
        check_schedule(paper, deepspeed=True, deepspeed_config={"scheduler": {"type": "WarmupLR"}})
    partial_offload = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}
    with pytest.raises(ValueError, match="Set the ratio to 1"):
        check_schedule(paper, deepspeed=True, deepspeed_config=partial_offload)
    partial_offload["zero_optimization"]["offload_optimizer"]["ratio"] = 1.0
    check_schedule(paper, deepspeed=True, deepspeed_config=partial_offload)
    check_schedule(settings(), deepspeed=True, deepspeed_config={"optimizer": {}, "scheduler": {}})  # merged, per step
    check_schedule(paper, deepspeed=True)  # the config unknown (a check from settings alone): nothing to refuse
    check_schedule(paper, deepspeed=False, deepspeed_config={"optimizer": {}})
