"""The base models the roles sit on (``Bases``), one object the trainer holds: which base serves each role and
adapter, and the extra bases loaded for ``role_models``.

Every role sits on one base model, the trainer's ``model`` unless ``role_models`` names another, and on one adapter
of that base. An adapter lives on one base (its LoRA matrices have that base's shapes), so adapter names are unique
across bases and every sample's base follows from its adapter. ``policy_sharing`` and ``role_to_adapter`` apply
within a base: under shared policy each base gets one shared adapter (``shared`` on the main base,
``shared-<name>`` on another).

The main base is the trainer's own PEFT model (TRL builds, wraps and prepares it). Each extra base is loaded here
once, with its own tokenizer and chat template, gets the same ``peft_config``, TRL's fused LM head (the loss reads
log-probs from it) and gradient checkpointing when the run asks for it, and lives on the training device beside
the main base; ``InstalledAdapters`` installs its adapters, ``SampleRouting`` routes its forwards, and the optimizer
steps its adapters with the main base's; under DeepSpeed the extra bases become submodules of the trainer's model
(``hold_in``), so the one engine holds and steps every base (each called through the engine's forward). The other
folders read what they need from ``Bases`` (the rollout backend factory one engine per base, checkpoints the saved
mapping) and never the configuration field.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..common.model_names import model_name, resolve_model_name
from ..seams.deepspeed import gathered as zero3_gathered
from .routing import SHARED_ADAPTER


@dataclass
class RoleBase:
    """An extra base model and what belongs to it."""

    name: str  # as configured, e.g. "Qwen/Qwen3-0.6B" or "toy-judge"
    model: Any  # PeftModel holding this base's role adapters
    tokenizer: Any  # this base's own tokenizer and chat template
    adapters: list[str] = field(default_factory=list)


def same_model(a: str, b: str) -> bool:
    """Whether two model names or folders are the same model (``"toy"`` and its folder are)."""
    a, b = resolve_model_name(a), resolve_model_name(b)
    if os.path.isdir(a) and os.path.isdir(b):
        return os.path.samefile(a, b)
    return a == b


def role_bases(roles: Sequence[str], role_models: Mapping[str, str] | None, main: str) -> dict[str, str]:
    """Role type -> the name of its base: ``main`` for roles ``role_models`` does not list (or lists as ``main``)."""
    unknown = sorted(set(role_models or {}) - set(roles))
    if unknown:
        raise ValueError(f"`role_models` names role(s) {unknown}; the workflow's roles are {list(roles)}.")
    bases = {}
    for role in roles:
        name = (role_models or {}).get(role, main)
        bases[role] = main if same_model(name, main) else name
    return bases


def adapters_on_bases(
    role_adapters: dict[str, str], bases: dict[str, str], main: str, *, explicit: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """(role -> adapter, adapter -> base): ``role_adapters`` as resolved on one base, placed on the roles' bases.

    Under shared policy (not ``explicit``) each extra base gets its own shared adapter; an explicit
    ``role_to_adapter`` must keep every adapter's roles on one base.
    """
    labels = _labels([b for b in dict.fromkeys(bases.values()) if b != main])
    placed = {}
    for role, adapter in role_adapters.items():
        on_extra = not explicit and adapter == SHARED_ADAPTER and bases[role] != main
        placed[role] = f"{SHARED_ADAPTER}-{labels[bases[role]]}" if on_extra else adapter
    adapter_base: dict[str, str] = {}
    for role, adapter in placed.items():
        base = adapter_base.setdefault(adapter, bases[role])
        if base != bases[role]:
            roles = {r: bases[r] for r, a in placed.items() if a == adapter}
            raise ValueError(
                f"Adapter {adapter!r} serves roles on different base models ({roles}); an adapter lives on one base. "
                "Give the roles on each base their own adapter in `role_to_adapter`, or put them on one base in "
                "`role_models`."
            )
    return placed, adapter_base


def place_roles(args, role_adapters: dict[str, str], main: str) -> tuple[dict[str, str], dict[str, str]]:
    """(role -> adapter, adapter -> base) of ``args.role_models`` for ``role_adapters`` as resolved on one base, the
    trainer's model being ``main``; settings that cannot hold with roles on several bases are refused here, before
    any base is loaded."""
    bases = role_bases(list(role_adapters), args.role_models, main)
    placed, adapter_base = adapters_on_bases(role_adapters, bases, main, explicit=bool(args.role_to_adapter))
    extra_names = [b for b in dict.fromkeys(adapter_base.values()) if b != main]
    if extra_names and args.cast_lm_head_to_fp32:
        raise ValueError(
            f"Roles on several base models (`role_models`: {extra_names} beside {main!r}) do not support "
            "`cast_lm_head_to_fp32`: it is applied to the trainer's model only, so the other bases' log-probs "
            "would be computed at another precision. Turn it off, or put every role on one base."
        )
    return placed, adapter_base


def _labels(names: Sequence[str]) -> dict[str, str]:
    """A short adapter-name-safe label per extra base: its folder or repo name (``Qwen3-0_6B``), made unique."""
    labels: dict[str, str] = {}
    for name in names:
        label = re.sub(r"[^A-Za-z0-9_\-]", "_", model_name(name).rstrip("/").split("/")[-1]) or "base"
        while label in labels.values():
            label += "_"
        labels[name] = label
    return labels


def load_role_base(
    name: str,
    peft_config,
    *,
    model_init_kwargs: dict[str, Any],
    device: torch.device,
    score_like_trainer: Callable[[torch.nn.Module], None],
    gradient_checkpointing: bool,
    gradient_checkpointing_kwargs: dict[str, Any] | None,
    seed: int,
) -> RoleBase:
    """Load base ``name`` as TRL loads the trainer's model, with ``peft_config`` (copied: PEFT writes into it) and
    gradient checkpointing as the Trainer enables it on its model; ``score_like_trainer(model)`` makes it score
    completions as TRL scores the trainer's model (the seam's ``score_like_trl``)."""
    from peft import get_peft_model
    from transformers import AutoTokenizer

    from ..seams.trl import create_model_from_path

    source = resolve_model_name(name)
    model = create_model_from_path(source, **model_init_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(  # at the model's revision, as TRL loads the trainer's tokenizer
        source,
        revision=model_init_kwargs.get("revision"),
        trust_remote_code=bool(model_init_kwargs.get("trust_remote_code", False)),
    )
    if tokenizer.pad_token is None:
        raise ValueError(f"The tokenizer of {name!r} has no pad token; set one in its tokenizer_config.json.")
    score_like_trainer(model)
    with torch.random.fork_rng(devices=[]):  # the main run's random stream stays as without this base
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, copy.deepcopy(peft_config))
    if gradient_checkpointing:
        peft_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)
        peft_model.enable_input_require_grads()
    return RoleBase(name=name, model=peft_model.to(device), tokenizer=tokenizer)


class Bases:
    """Which base serves each role and adapter; ``extra`` holds the bases other than the trainer's ``model``.

    Without ``role_models`` there is one base, unnamed: ``main`` is None, every adapter's base is None and
    ``role_base`` is None (model calls then carry no base name).

    Args:
        main: the name of the trainer's base model (None: the run's one base, no ``role_models``).
        role_adapters: role type -> adapter, already placed on the bases (``adapters_on_bases``).
        adapter_base: adapter -> the name of its base.
        extra: base name -> ``RoleBase`` for every base but ``main``.
    """

    def __init__(
        self, main: str | None, role_adapters: dict[str, str], adapter_base: dict[str, str | None], *, extra=None
    ):
        self.main = main
        self.role_adapters = dict(role_adapters)
        self.adapter_base = dict(adapter_base)
        self.extra: dict[str, RoleBase] = dict(extra or {})
        for base in self.extra.values():
            base.adapters = [a for a, b in self.adapter_base.items() if b == base.name]
        missing = sorted(set(self.adapter_base.values()) - {main, *self.extra})
        if missing:
            raise ValueError(f"Base model(s) {missing} serve adapters but were not loaded.")

    @classmethod
    def one(cls, role_adapters: dict[str, str]) -> Bases:
        """Every role on the trainer's model (no ``role_models``)."""
        return cls(None, role_adapters, dict.fromkeys(role_adapters.values()))

    @classmethod
    def from_config(
        cls,
        args,
        *,
        peft_model,
        role_adapters: dict[str, str],
        device,
        peft_config=None,
        quantization_config=None,
        score_like_trainer: Callable[[torch.nn.Module], None] | None = None,
    ) -> Bases:
        """The bases ``args.role_models`` asks for once TRL built ``peft_model`` (the trainer's), its extra bases
        loaded; ``Bases.one`` without it. ``role_adapters``: role -> adapter as resolved on one base; ``peft_config``:
        the trainer's, as the user gave it (before PEFT resolved ``"all-linear"`` for the main base);
        ``score_like_trainer``: applied to each extra base so TRL's log-prob code scores it as the trainer's model."""
        if not args.role_models:
            return cls.one(role_adapters)
        main_config = next(iter(peft_model.peft_config.values()))
        config = peft_config if peft_config is not None else main_config
        main = model_name(main_config.base_model_name_or_path)
        placed, adapter_base = place_roles(args, role_adapters, main)
        extra_names = [b for b in dict.fromkeys(adapter_base.values()) if b != main]
        if extra_names and score_like_trainer is None:
            raise ValueError("Loading other bases needs `score_like_trainer` (the trainer passes the seam's).")
        kwargs = {"trust_remote_code": args.trust_remote_code, **(args.model_init_kwargs or {})}
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
            # quantized as it loads: on this process's GPU from the start, as TRL's k-bit device map placed models
            kwargs["device_map"] = {"": device}
        kept = {k: v for k, v in (args.gradient_checkpointing_kwargs or {}).items() if k not in _LAYOUT_KEYS}
        extra = {
            name: load_role_base(
                name,
                config,
                model_init_kwargs=kwargs,
                device=device,
                score_like_trainer=score_like_trainer,
                gradient_checkpointing=args.gradient_checkpointing,
                gradient_checkpointing_kwargs=kept or None,
                seed=args.seed,
            )
            for name in extra_names
        }
        return cls(main, placed, adapter_base, extra=extra)

    # ------------------------------------------------------------------------------- under one DeepSpeed engine
    def hold_in(self, model: torch.nn.Module) -> None:
        """Make the extra bases submodules of ``model`` (the trainer's PEFT model, before DeepSpeed prepares it), so
        the one engine DeepSpeed builds around ``model`` holds every base: ZeRO-3 partitions their parameters (and
        gathers them in each of their forwards), ZeRO-2 and ZeRO-3 reduce their gradients and partition their
        optimizer state, and the engine's optimizer steps their adapters with the trainer's. They stay out of
        ``model.state_dict()``: what PEFT saves or syncs for the trainer's base holds its own adapters only, and each
        base's adapters are read from that base's own PEFT model. Call it once every base's adapters are installed
        and routed (the routers scan their own model's layers)."""
        if not self.extra or hasattr(model, ENGINE_HOLDER):
            return
        model.add_module(ENGINE_HOLDER, _HeldBases([base.model for base in self.extra.values()]))

    def holds(self, engine) -> bool:
        """Whether ``engine`` (a wrapped trainer's model) is the DeepSpeed engine around the model holding these
        bases."""
        held = getattr(getattr(engine, "module", None), ENGINE_HOLDER, None)
        return held is not None and any(m is b.model for m in held.bases for b in self.extra.values())

    @contextmanager
    def gathered(self, modifier_rank: int | None = None) -> Iterator[None]:
        """The extra bases' trainable parameters whole while it lasts (ZeRO-3 partitions them; no-op otherwise);
        with ``modifier_rank``, what that process writes into them is kept (partitioned again from its values).
        Every process enters it: gathering is collective."""
        with zero3_gathered(
            [p for b in self.extra.values() for p in b.model.parameters() if p.requires_grad], modifier_rank
        ):
            yield

    @staticmethod
    def own_state(state_dict: dict | None) -> dict | None:
        """``state_dict`` of the trainer's model without the extra bases it holds (ZeRO-3's consolidated state
        dict reads every submodule's parameters, not ``state_dict()``)."""
        if state_dict is None:
            return None
        return {k: v for k, v in state_dict.items() if not k.startswith(f"{ENGINE_HOLDER}.")}

    @property
    def role_base(self) -> dict[str, str] | None:
        """Role type -> the name of its base, or None with one unnamed base."""
        if self.main is None:
            return None
        return {role: self.adapter_base[adapter] for role, adapter in self.role_adapters.items()}

    def base_of(self, adapter: str) -> str | None:
        return self.adapter_base[adapter]

    def adapters_of(self, base: str | None) -> list[str]:
        return [a for a, b in self.adapter_base.items() if b == base]

    def pad_token_ids(self, calls, tokenizer) -> int | list[int]:
        """The pad id of each call's own base (``tokenizer``'s for the trainer's), or one id for a single base."""
        pads = {b.name: b.tokenizer.pad_token_id for b in self.extra.values()}
        return [pads.get(c.base, tokenizer.pad_token_id) for c in calls] if pads else tokenizer.pad_token_id

    def saved_mapping(self) -> dict[str, str]:
        """Role -> base model name for the roles not on the main base (what ``multiagent_config.json`` stores)."""
        return {role: model_name(base) for role, base in (self.role_base or {}).items() if base != self.main}


ENGINE_HOLDER = "multiagent_role_bases"  # the trainer's model's submodule holding the extra bases under DeepSpeed


class _HeldBases(torch.nn.Module):
    """The extra bases' PEFT models, held by the trainer's model for DeepSpeed's engine; left out of state dicts."""

    def __init__(self, models: Sequence[torch.nn.Module]):
        super().__init__()
        self.bases = torch.nn.ModuleList(models)
        self.register_state_dict_post_hook(_drop_own_keys)

    def forward(self, *args, **kwargs):
        raise RuntimeError("The held bases are called one by one, through their own PEFT models.")


def _drop_own_keys(module, state_dict, prefix, local_metadata) -> None:
    for key in [k for k in state_dict if k.startswith(prefix)]:
        del state_dict[key]


_LAYOUT_KEYS = ("every_n_layers", "offload")  # Trainer-only gradient checkpointing keys, not for torch's checkpoint
