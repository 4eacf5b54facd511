"""transformers below its public surface (the names ``transformers`` exports at top level, and the callbacks of
``transformers.integrations`` its reference documents), the Trainer's private members aside (``grpo_seam.py``).
Checked against transformers 5.3 (setup.cfg's floor) and 5.24."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

# `utils.chat_template_utils.get_json_schema` (since 4.42), exported as `transformers.utils.get_json_schema`: a
# Python function's JSON schema from its signature, type hints and Google-style docstring, which
# `apply_chat_template(tools=...)` renders.
# `utils.import_utils.is_torch_bf16_gpu_available` (since 4.21): whether an accelerator trains in bf16, the check
# TrainingArguments makes before it accepts `bf16=True`.
from transformers.utils import get_json_schema, is_torch_bf16_gpu_available

__all__ = ["add_json_dict_fields", "get_json_schema", "is_torch_bf16_gpu_available", "refill_deepspeed_config"]

Config = TypeVar("Config")


def add_json_dict_fields(*names: str) -> Callable[[type[Config]], type[Config]]:
    """A class decorator for a ``TrainingArguments`` subclass: its fields ``names`` accept a JSON object given as a
    string on the command line. TrainingArguments' ``__post_init__`` decodes every field its private class attribute
    ``_VALID_DICT_FIELDS`` lists (since 4.40; TRL's configs extend it the same way)."""

    def add(cls: type[Config]) -> type[Config]:
        cls._VALID_DICT_FIELDS = [*cls._VALID_DICT_FIELDS, *names]
        return cls

    return add


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
