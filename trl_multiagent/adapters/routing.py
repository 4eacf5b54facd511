"""Which adapter serves which role, and per-sample routing of mixed-adapter batches.

Under shared policy every role uses one adapter; under isolated policy each role *type* gets its own (three voters
share ``generator``); any other grouping is an explicit role-to-adapter mapping.

Routing works through hooks on the LoRA layers that apply each sample's adapter (on every layer while a batch mixes
adapters: on plain LoRA linear layers each adapter's LoRA is added on its rows, on any other the per-sample adapter
names go to PEFT's mixed path). PEFT's own ``adapter_names=`` argument refuses training mode, switching adapters
between forwards is silently wrong under gradient checkpointing (the recomputed forward uses whatever adapter is
active during backward), and ``disable_adapter()`` re-enables gradients of the active adapter only. The hooks read
the routing at call time, so the recomputation in backward sees the same routing as the forward, and no adapter is
ever switched or disabled.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ..seams.peft import (
    AdapterRows,
    add_rows_after,
    adds_rows_itself,
    applies_one_adapter_per_forward,
    lora_layers,
    pass_adapter_names,
    point_at,
)

SHARED_ADAPTER = "shared"
BASE_MODEL = "__base__"  # routes a sample past every adapter: the reference (base) model
_ADAPTER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def resolve_role_adapters(
    roles: Sequence[str], policy_sharing: str, role_to_adapter: dict[str, str] | None = None
) -> dict[str, str]:
    """Map every role type of a workflow to the name of the adapter that serves it."""
    if role_to_adapter:
        unknown = sorted(set(role_to_adapter) - set(roles))
        if unknown:
            raise ValueError(
                f"`role_to_adapter` names role(s) {unknown} that the workflow does not have; its roles are "
                f"{list(roles)}."
            )
        missing = [role for role in roles if role not in role_to_adapter]
        if missing:
            raise ValueError(f"`role_to_adapter` must map every role of the workflow; missing {missing}.")
        mapping = {role: role_to_adapter[role] for role in roles}
    elif policy_sharing == "shared":
        mapping = {role: SHARED_ADAPTER for role in roles}
    elif policy_sharing == "isolated":
        mapping = {role: role for role in roles}
    else:
        raise ValueError(f"`policy_sharing` must be 'shared' or 'isolated', got {policy_sharing!r}.")
    for adapter in mapping.values():
        if not _ADAPTER_NAME.match(adapter) or adapter in (BASE_MODEL, "default", "ref"):
            raise ValueError(
                f"Adapter name {adapter!r} is not usable: use letters, digits, '_' or '-', and not "
                f"'{BASE_MODEL}', 'default' or 'ref'."
            )
    return mapping


def unique_adapters(role_adapters: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(role_adapters.values()))


def install_role_adapters(peft_model, adapter_names: Sequence[str], source: str = "default") -> None:
    """Give ``peft_model`` one trainable LoRA adapter per name, those it lacks starting from the ``source`` adapter.

    Starting every role from the same initialisation keeps shared and isolated runs comparable, and keeps a
    shared-policy run numerically identical to plain TRL (which initialises ``default``). A ready ``PeftModel``
    whose adapters are named after the role adapters keeps them as they are.
    """
    missing = [name for name in adapter_names if name not in peft_model.peft_config]
    if missing and source not in peft_model.peft_config:
        raise ValueError(
            f"The model's adapters are {list(peft_model.peft_config)}; role adapter(s) {missing} are missing and "
            f"there is no {source!r} adapter to start them from. Name the PeftModel's adapters after the role "
            f"adapters {list(adapter_names)}, or give it a {source!r} adapter."
        )
    for name in missing:
        peft_model.add_adapter(name, peft_model.peft_config[source])
    with torch.no_grad():
        for name in missing:
            for param, copy in paired_parameters(peft_model, source, name, lora_only=False):
                copy.copy_(param)
    if source in peft_model.peft_config and source not in adapter_names:
        peft_model.set_adapter(adapter_names[0])  # deleting the active adapter would warn
        peft_model.delete_adapter(source)
    set_adapters_trainable(peft_model, adapter_names)


def set_adapters_trainable(peft_model, adapter_names: Sequence[str]) -> None:
    """Mark the LoRA weights of every named adapter trainable (PEFT only keeps the active one trainable)."""
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            param.requires_grad = any(f".{adapter}." in name for adapter in adapter_names)


def adapter_parameters(peft_model, adapter: str) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in peft_model.named_parameters() if "lora_" in n and f".{adapter}." in n}


def paired_parameters(
    peft_model, adapter: str, other: str, *, lora_only: bool = True
) -> Iterator[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """Each parameter of ``adapter`` with the same parameter of ``other`` (a copy or shadow of the same config)."""
    for name, param in peft_model.named_parameters():
        if f".{adapter}." in name and (not lora_only or "lora_" in name):
            yield param, peft_model.get_parameter(name.replace(f".{adapter}.", f".{other}."))


class AdapterRouter:
    """Routes each sample of a batch to its adapter through hooks on the LoRA layers.

    A batch that uses one adapter (every batch under shared policy, and every tick of parallel instances of one
    role) takes PEFT's ordinary path: the layers' active adapter is pointed at it for as long as the routing holds,
    without ``set_adapter`` (which would freeze the other adapters). Only batches that really mix adapters pay for
    per-sample routing: on plain LoRA linear layers (nearly all) each adapter's LoRA is added on its rows from row
    indices built once per batch on the device (``add_adapter_rows``); any other LoRA layer gets the per-sample
    names and PEFT's own mixed path, which indexes with Python lists (a blocking host-to-device copy per adapter and
    layer on a GPU).
    """

    def __init__(self, model: torch.nn.Module):
        self._names: list[str] | None = None  # per-sample names, only while a batch mixes adapters
        self._layers = lora_layers(model)
        if not self._layers:
            raise ValueError("The model has no LoRA layers to route; pass a LoRA `peft_config` to the trainer.")
        # LoRA on a weight (MoE experts and routers) sees the batch's tokens flattened and applies one weight per
        # forward: such a model cannot mix adapters inside one batch, and its callers split mixed batches by adapter
        # instead (exact: each sample still goes through its own adapter).
        self._weight_layers = {layer for layer in self._layers if applies_one_adapter_per_forward(layer)}
        self.mixes_adapters = not self._weight_layers
        self._adds_rows = {layer for layer in self._layers if adds_rows_itself(layer)}
        # A hook on a layer sends every call of it down nn.Module's slow path. The first layer that sees whole
        # samples keeps one (it checks that forwards have the routed number of samples, and passes the names); the
        # other layers get theirs only while a batch mixes adapters (`set`), the one time they have work to do.
        checked = [layer for layer in self._layers if layer not in self._weight_layers][:1]
        self._handles = [pass_adapter_names(layer, self._adapter_names_for) for layer in checked]
        self._unchecked = [layer for layer in self._layers if layer not in checked]
        self._mixing_handles: list = []
        self._routing: list[str] | None = None
        self._groups: list[tuple[str, list[int]]] = []  # each adapter of a mixed batch and its rows
        self._rows_on: dict[torch.device, list[AdapterRows]] = {}  # the same, as index tensors on each device
        self._original_active = [layer.active_adapter for layer in self._layers]

    def _adapter_names_for(self, layer: torch.nn.Module, x: torch.Tensor) -> list[str] | None:
        if self._routing is None:
            return None
        if layer not in self._weight_layers and x.shape[0] != len(self._routing):  # weight LoRA sees tokens flat
            raise RuntimeError(
                f"Adapter routing holds {len(self._routing)} samples but a LoRA layer received a batch of "
                f"{x.shape[0]}."
            )
        if layer in self._adds_rows:  # its rows are added after its base's forward (`_rows_for`)
            return None
        return self._names  # None for one adapter for the whole batch: PEFT's own path

    def _rows_for(self, layer: torch.nn.Module, x: torch.Tensor) -> list[AdapterRows] | None:
        if self._names is None:
            return None
        rows = self._rows_on.get(x.device)
        if rows is None:  # once per batch and device, not once per layer
            rows = [(adapter, torch.tensor(indices, device=x.device)) for adapter, indices in self._groups]
            self._rows_on[x.device] = rows
        return rows

    def set(self, names: Sequence[str] | None) -> None:
        """Route the next forwards (and the recomputation of checkpointed ones in backward) sample by sample."""
        self._routing = list(names) if names is not None else None
        self._rows_on = {}
        unique = set(self._routing) if self._routing else set()
        if len(unique) > 1 and not self.mixes_adapters:
            raise ValueError(
                f"This model's LoRA layers cannot mix adapters in one batch (MoE weights); got {sorted(unique)}. "
                "Split the batch by adapter (`forward_keys`)."
            )
        if len(unique) == 1:
            # A name that is no adapter of a layer ("__base__") makes PEFT skip that layer's LoRA: the base model.
            self._names, self._groups = None, []
            for layer in self._layers:
                point_at(layer, [next(iter(unique))])
        else:
            self._names = self._routing
            names = self._names or []
            self._groups = [(a, [i for i, n in enumerate(names) if n == a]) for a in dict.fromkeys(names)]
            for layer, active in zip(self._layers, self._original_active):
                adds_rows = self._names is not None and layer in self._adds_rows
                point_at(layer, [BASE_MODEL] if adds_rows else active)  # its own forward: the base layer only
        if self._names is not None and not self._mixing_handles:
            by_name = [layer for layer in self._unchecked if layer not in self._adds_rows]
            self._mixing_handles = [pass_adapter_names(layer, self._adapter_names_for) for layer in by_name]
            by_rows = [layer for layer in self._layers if layer in self._adds_rows]
            self._mixing_handles += [add_rows_after(layer, self._rows_for) for layer in by_rows]
        elif self._names is None:
            self._remove_mixing_hooks()

    @contextmanager
    def route(self, names: Sequence[str]) -> Iterator[None]:
        previous = self._routing
        self.set(names)
        try:
            yield
        finally:
            self.set(previous)

    def _remove_mixing_hooks(self) -> None:
        for handle in self._mixing_handles:
            handle.remove()
        self._mixing_handles = []

    def remove(self) -> None:
        self.set(None)
        for handle in self._handles:
            handle.remove()
