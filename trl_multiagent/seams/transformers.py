"""transformers below its public surface (the names ``transformers`` exports at top level, and the callbacks of
``transformers.integrations`` its reference documents), the Trainer's private members aside (``trainer/grpo_seam.py``).
Checked against transformers 5.3 (setup.cfg's floor) and 5.25; where they differ, the branch is here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

# `utils.chat_template_utils.get_json_schema` (since 4.42), exported as `transformers.utils.get_json_schema`: a
# Python function's JSON schema from its signature, type hints and Google-style docstring, which
# `apply_chat_template(tools=...)` renders.
# `utils.import_utils.is_torch_bf16_gpu_available` (since 4.21): whether an accelerator trains in bf16, the check
# TrainingArguments makes before it accepts `bf16=True`.
from transformers.utils import get_json_schema, is_torch_bf16_gpu_available

__all__ = [
    "add_json_dict_fields",
    "attention_implementation",
    "get_json_schema",
    "is_torch_bf16_gpu_available",
    "refill_deepspeed_config",
    "rename_checkpointing",
]

Config = TypeVar("Config")


def add_json_dict_fields(*names: str) -> Callable[[type[Config]], type[Config]]:
    """A class decorator for a ``TrainingArguments`` subclass: its fields ``names`` accept a JSON object given as a
    string on the command line. TrainingArguments' ``__post_init__`` decodes every field its private class attribute
    ``_VALID_DICT_FIELDS`` lists (since 4.40; TRL's configs extend it the same way)."""

    def add(cls: type[Config]) -> type[Config]:
        cls._VALID_DICT_FIELDS = [*cls._VALID_DICT_FIELDS, *names]
        return cls

    return add


def rename_checkpointing(args) -> None:
    """Carry ``gradient_checkpointing`` (and its ``_kwargs``) to the name the installed transformers reads.

    transformers 5.25 renamed them ``activation_checkpointing`` (and ``_kwargs``); the old names are aliases, read
    only when the new one is unset, with a FutureWarning from ``TrainingArguments.__post_init__``. TRL's configs still
    set the old name's default (True), so every config warned, and a preset that works on every transformers this
    package supports (5.3 has only the old name) must use the old name. Before that ``__post_init__``, a value under
    the old name whose new name is unset moves to the new name, without the warning (transformers then mirrors it
    back). On releases without the new name (5.3 to 5.24) nothing changes.
    """
    fields = type(args).__dataclass_fields__
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if new in fields and getattr(args, new) is None and getattr(args, old) is not None:
            setattr(args, new, getattr(args, old))
            setattr(args, old, None)


def checkpointing_on(model) -> bool:
    """Whether ``model`` recomputes its activations in the backward (``PreTrainedModel.is_activation_checkpointing``).

    transformers 5.25 renamed the checkpointing names ``activation_checkpointing``; the old ones
    (``is_gradient_checkpointing``, ``gradient_checkpointing_enable`` / ``_disable``) stay as aliases that warn at
    each use, a FutureWarning at each training forward that reads them. 5.3 to 5.24 have only the old names.
    """
    try:
        return model.is_activation_checkpointing  # a PEFT model forwards the read to its base model
    except AttributeError:
        return model.is_gradient_checkpointing


@contextmanager
def checkpointing_off(model, checkpointing_kwargs: dict | None = None) -> Iterator[None]:
    """Activation checkpointing off on ``model`` while it lasts, back on after with ``checkpointing_kwargs`` where it
    was on: what TRL's ``disable_gradient_checkpointing`` does (trl/models/utils.py:397, TRL 1.16), under the names
    the installed transformers reads without a warning (TRL 1.16 reads the old ones, three warnings a use)."""
    was_on = checkpointing_on(model)
    renamed = hasattr(model, "activation_checkpointing_disable")
    if was_on:
        model.activation_checkpointing_disable() if renamed else model.gradient_checkpointing_disable()
    try:
        yield
    finally:
        if was_on and renamed:
            model.activation_checkpointing_enable(checkpointing_kwargs)
        elif was_on:
            model.gradient_checkpointing_enable(checkpointing_kwargs)


def refill_deepspeed_config(args) -> None:
    """Fill the DeepSpeed config's ``"auto"`` values again from ``args`` (after a config changed its batch sizes).

    TrainingArguments' ``__post_init__`` builds ``args.hf_deepspeed_config`` (an attribute it does not document) with
    ``HfTrainerDeepSpeedConfig`` (``integrations.deepspeed``, not exported; the class since 4.7, checked at that path
    in 5.0, 5.3 and 5.24) and fills the config's ``"auto"`` batch sizes and accumulation from the arguments
    (``trainer_config_process``); the Trainer hands DeepSpeed that config."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args.hf_deepspeed_config = HfTrainerDeepSpeedConfig(args.deepspeed)
    args.hf_deepspeed_config.trainer_config_process(args)


def rotate_checkpoints(output_dir: str, save_total_limit: int | None, best_model_checkpoint: str | None) -> None:
    """Delete the oldest ``checkpoint-*`` folders of ``output_dir`` past ``save_total_limit``, keeping the best, as the
    Trainer does after each save: ``trainer_utils.rotate_checkpoints`` (a function since 5.x; 5.0's Trainer had it as
    the method ``_rotate_checkpoints``; our floor 5.3 has the function)."""
    from transformers.trainer_utils import rotate_checkpoints as rotate

    rotate(output_dir, save_total_limit, best_model_checkpoint)


@contextmanager
def bf16_accepted_without_device() -> Iterator[None]:
    """While it lasts, ``TrainingArguments`` accept ``bf16=True`` on a machine without a bf16 accelerator, as a GPU
    machine does: their argument checks (``_validate_args``; ``__post_init__`` before 5.0, the same in 5.3 and 5.25)
    ask ``is_torch_bf16_gpu_available`` as imported into ``transformers.training_args`` (since 4.21), and that name is
    answered yes here. Validation (``--validate``) builds a GPU run's settings with it; nothing is trained."""
    import transformers.training_args as training_args

    asked = training_args.is_torch_bf16_gpu_available
    training_args.is_torch_bf16_gpu_available = lambda *args, **kwargs: True
    try:
        yield
    finally:
        training_args.is_torch_bf16_gpu_available = asked


def attention_implementation(config) -> str | None:
    """The attention a model's layers dispatch to (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``,
    ``"flex_attention"``, a hub kernel's name): ``PretrainedConfig._attn_implementation``, a private property that
    every attention layer reads at each forward (since 4.36; the same in 5.3 and 5.25). None for a config without
    it."""
    return getattr(config, "_attn_implementation", None)
