"""Per-sample adapter routing: mixed batches train each adapter exactly as per-role sub-batches would."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model
from tiny import tiny_lora
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from trl_multiagent.adapters.routing import (
    AdapterRouter,
    adapter_parameters,
    install_role_adapters,
    resolve_role_adapters,
)

ROLES = ("generator", "evaluator", "aggregator")


def routed_model(model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, tiny_lora())
    install_role_adapters(peft_model, list(ROLES))
    with torch.no_grad():  # B starts at zero; make every adapter different and active
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.2)
    return peft_model, AdapterRouter(peft_model)


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("checkpointing", [None, {"use_reentrant": True}, {"use_reentrant": False}])
def test_mixed_batch_gradients_equal_per_role_sub_batches(tiny_model_dir, checkpointing):
    model, router = routed_model(tiny_model_dir)
    model.train()
    input_ids = torch.randint(3, 400, (6, 10))
    routing = ["generator", "evaluator", "generator", "aggregator", "__base__", "evaluator"]
    weights = torch.linspace(0.5, 2.0, 6)

    def loss_of(logits, rows):
        return (logits.float().log_softmax(-1)[..., 0].mean(-1) * weights[rows]).sum()

    # Reference: one sub-batch per adapter, no checkpointing.
    model.zero_grad()
    for adapter in dict.fromkeys(routing):
        if adapter == "__base__":  # no trainable weight sees these rows
            continue
        rows = [i for i, a in enumerate(routing) if a == adapter]
        with router.route([adapter] * len(rows)):
            loss_of(model(input_ids=input_ids[rows]).logits, rows).backward()
    expected = grads(model)

    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
        model.enable_input_require_grads()
    model.zero_grad()
    router.set(routing)  # stays set through backward, as in the trainer
    loss_of(model(input_ids=input_ids).logits, list(range(6))).backward()
    router.set(None)
    actual = grads(model)

    assert set(actual) == set(expected)
    for role in ROLES:
        assert any(n in actual for n in adapter_parameters(model, role))  # every adapter received gradient
    assert max((actual[n] - expected[n]).abs().max().item() for n in expected) < 1e-6


def test_base_routing_equals_adapters_disabled(tiny_model_dir):
    model, router = routed_model(tiny_model_dir)
    model.eval()
    input_ids = torch.randint(3, 400, (2, 7))
    with torch.no_grad():
        with model.disable_adapter():
            disabled = model(input_ids=input_ids).logits
        with router.route(["__base__", "__base__"]):
            routed = model(input_ids=input_ids).logits
        with router.route(["generator", "generator"]):
            adapted = model(input_ids=input_ids).logits
    assert torch.allclose(disabled, routed, atol=1e-6)
    assert not torch.allclose(disabled, adapted, atol=1e-3)


def test_routing_length_mismatch_is_an_error(tiny_model_dir):
    model, router = routed_model(tiny_model_dir)
    with router.route(["generator"]), pytest.raises(RuntimeError, match="Adapter routing holds 1 samples"):
        model(input_ids=torch.randint(3, 400, (2, 5)))


def test_resolve_role_adapters():
    assert resolve_role_adapters(ROLES, "shared") == dict.fromkeys(ROLES, "shared")
    assert resolve_role_adapters(ROLES, "isolated") == {r: r for r in ROLES}
    grouping = {"generator": "solver", "evaluator": "judge", "aggregator": "judge"}
    assert resolve_role_adapters(ROLES, "shared", grouping) == grouping
    with pytest.raises(ValueError, match=r"names role\(s\) \['critic'\]"):
        resolve_role_adapters(ROLES, "shared", {**grouping, "critic": "judge"})
    with pytest.raises(ValueError, match="must map every role"):
        resolve_role_adapters(ROLES, "shared", {"generator": "solver"})
    with pytest.raises(ValueError, match="not usable"):
        resolve_role_adapters(ROLES, "shared", {"generator": "a.b", "evaluator": "j", "aggregator": "j"})


def test_single_adapter_batches_take_the_plain_path_and_keep_every_adapter_trainable(tiny_model_dir):
    model, router = routed_model(tiny_model_dir)
    model.eval()
    input_ids = torch.randint(3, 400, (2, 7))
    with torch.no_grad():
        with router.route(["evaluator", "generator"]):  # mixed: PEFT's per-sample path
            mixed = model(input_ids=input_ids).logits
        with router.route(["evaluator", "evaluator"]):  # uniform, not the active adapter: the plain path
            uniform = model(input_ids=input_ids).logits
    assert torch.allclose(mixed[0], uniform[0], atol=1e-6)
    assert not torch.allclose(mixed[1], uniform[1], atol=1e-3)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    active = {tuple(layer.active_adapters) for layer in router._layers}
    assert active == {(model.active_adapter,)}  # restored once the routing is released


def test_only_a_mixed_batch_puts_a_hook_on_every_lora_layer(tiny_model_dir):
    """A forward hook sends every call of its layer down nn.Module's slow path: one layer keeps the router's (it
    checks the routed number of samples), every other layer gets one only while a batch mixes adapters."""
    model, router = routed_model(tiny_model_dir)

    def hooked() -> int:
        return sum(bool(layer._forward_pre_hooks or layer._forward_hooks) for layer in router._layers)

    assert hooked() == 1 < len(router._layers)
    with router.route(["evaluator", "evaluator"]):
        assert hooked() == 1
        with router.route(["evaluator", "generator"]):
            assert hooked() == len(router._layers)
        assert hooked() == 1
    router.remove()
    assert hooked() == 0


class TensorsFromPythonData(TorchDispatchMode):
    """Counts the tensors made from Python data (``torch.tensor(list)``, and indexing with a list): on a GPU each is
    a blocking host-to-device copy."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket == torch.ops.aten.lift_fresh
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("training", [False, True])
def test_a_mixed_batch_makes_its_row_indices_once_not_in_every_layer(tiny_model_dir, training):
    """PEFT's mixed path indexes each layer's input and output with Python lists (two host-to-device copies per
    adapter and layer, which stall a GPU's decoding step); the router makes one index tensor per adapter per batch."""
    model, router = routed_model(tiny_model_dir)
    model.train(training)
    input_ids = torch.randint(3, 400, (4, 6))

    def made_by(names, **kwargs) -> int:
        with router.route(names), TensorsFromPythonData() as made:
            logits = model(input_ids=input_ids, **kwargs).logits
            if training:
                logits.float().sum().backward()
        return made.count

    names = ["generator", "evaluator", "generator", "aggregator"]
    by_the_model = made_by(["generator"] * 4)  # one adapter: PEFT's plain path, whatever the model itself makes
    assert made_by(names) - by_the_model == len(set(names))
    model.eval()
    with torch.no_grad(), TensorsFromPythonData() as made_by_peft:
        model(input_ids=input_ids, adapter_names=names)
    assert made_by_peft.count - by_the_model >= 2 * len(router._layers)  # what the router saves


ROUTINGS = {
    "mixed": ["generator", "evaluator", "generator", "aggregator", "__base__", "evaluator"],
    "one adapter": ["evaluator"] * 6,  # not the model's active adapter: the layers are pointed at it
    "base": ["__base__"] * 6,
}


@pytest.mark.parametrize("checkpointing", [None, {"use_reentrant": True}, {"use_reentrant": False}])
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_routing_gives_what_peft_public_paths_give(tiny_model_dir, routing, checkpointing):
    """The router chooses adapters through PEFT's internals (seams/peft.py: the layers' private active adapter, and
    per-sample names handed to the layers). PEFT's public paths, on an identical model without checkpointing, give
    the same outputs and gradients: ``set_adapter`` per adapter and ``disable_adapter`` for the base model, each on
    its own rows; for a mixed batch also the model's ``adapter_names=`` (eval mode, the only one PEFT allows)."""
    names = ROUTINGS[routing]
    input_ids = torch.randint(3, 400, (6, 10), generator=torch.Generator().manual_seed(1))
    weights = torch.linspace(0.5, 2.0, 6)

    def loss_of(logits, rows):
        return (logits.float().log_softmax(-1)[..., 0].mean(-1) * weights[rows]).sum()

    public, _ = routed_model(tiny_model_dir)
    public.train()
    expected_logits = torch.zeros(6, 10, public.config.vocab_size)
    for adapter in dict.fromkeys(names):
        rows = [i for i, a in enumerate(names) if a == adapter]
        if adapter == "__base__":
            with public.disable_adapter():
                expected_logits[rows] = public(input_ids=input_ids[rows]).logits.detach()
            continue
        public.set_adapter(adapter)
        logits = public(input_ids=input_ids[rows]).logits
        loss_of(logits, rows).backward()
        expected_logits[rows] = logits.detach()
    expected = grads(public)
    if routing == "mixed":
        public.eval()
        with torch.no_grad():
            by_name = public(input_ids=input_ids, adapter_names=names).logits
        assert torch.allclose(by_name, expected_logits, atol=1e-5)

    model, router = routed_model(tiny_model_dir)
    model.train()
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
        model.enable_input_require_grads()
    router.set(names)  # stays set through backward, as in the trainer
    logits = model(input_ids=input_ids).logits
    if logits.requires_grad:  # the base model alone has nothing to train (unless checkpointing asked input grads)
        loss_of(logits, list(range(6))).backward()
    router.set(None)
    actual = grads(model)

    assert torch.allclose(logits.detach(), expected_logits, atol=1e-5)
    assert set(actual) == set(expected) and (routing == "base") == (not expected)
    assert all(torch.allclose(actual[n], expected[n], atol=1e-6) for n in expected)
