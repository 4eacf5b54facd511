"""TRL below its public surface (the names ``trl`` exports at top level): the helpers the package uses as TRL does.

Checked against TRL 1.14.2 (setup.cfg's floor) and 1.16 (the newest the range allows); ``TRL_VERSION`` branches where
they differ.
"""

from __future__ import annotations

import torch
import trl
from packaging.version import Version

# TRL's `chat_template_utils.parse_response` (since 0.26): a completion's token ids -> the assistant message, its tool
# calls read by the tokenizer's response schema, plain text when they do not parse. 1.16 takes the tools' schemas
# (`tools=`) to type the arguments; 1.14.2 does not.
from trl.chat_template_utils import parse_response

# TRL's `models.utils.disable_gradient_checkpointing` (since 0.26): turns the model's gradient checkpointing off for
# no-grad forwards (the log-probs before an update) and back on with the same kwargs.
# `models.utils.unwrap_model_for_generation` (since 0.8.2): the model out of its DDP / DeepSpeed wrapper for
# generation, ZeRO-3's parameters gathered while it lasts.
from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation

# TRL's `trainer.utils.nanstd` (since 0.17): the std of the non-NaN values, with Bessel's correction, as GRPOTrainer
# scales its advantages and logs `reward_std`. `create_model_from_path` (since 0.24): a model id or folder -> the
# model, loaded as GRPOTrainer loads its own from `model_init_kwargs` (dtype "auto" and friends).
from trl.trainer.utils import create_model_from_path, nanstd

__all__ = [
    "TRL_VERSION",
    "create_model_from_path",
    "disable_gradient_checkpointing",
    "nanstd",
    "parse_response",
    "score_like_trl",
    "unwrap_model_for_generation",
]

TRL_VERSION = Version(trl.__version__)


def score_like_trl(model: torch.nn.Module, temperature: float) -> None:
    """Make ``model`` (a base model other than the trainer's) score completions the way TRL scores its own model, so
    TRL's `_get_per_token_logps_and_entropies` can run on it."""
    if TRL_VERSION >= Version("1.15.0"):
        # TRL >= 1.15 patches its model with a fused LM head (`trainer.utils.add_fused_lm_head`) and calls it with
        # `fused_lm_head=True`, which returns the log-probs and entropies at `temperature` without the full logits:
        # the other bases need the same patch.
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    # TRL 1.14 computes them from the model's ordinary logits (`selective_log_softmax`): nothing to add.
