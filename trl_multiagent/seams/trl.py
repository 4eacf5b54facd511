"""TRL below its public surface (the names ``trl`` exports at top level): the helpers the package uses as TRL does.

Checked against TRL 1.14.2 (setup.cfg's floor) and 1.16 (the newest the range allows); ``TRL_VERSION`` branches where
they differ.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import trl
from packaging.version import Version

# TRL's `chat_template_utils.parse_response` (since 0.26): a completion's token ids -> the assistant message, its tool
# calls read by the tokenizer's response schema, plain text when they do not parse. 1.16 takes the tools' schemas
# (`tools=`) to type the arguments; 1.14.2 does not.
from trl.chat_template_utils import parse_response

# `models.utils.unwrap_model_for_generation` (since 0.8.2): the model out of its DDP / DeepSpeed wrapper for
# generation, ZeRO-3's parameters gathered while it lasts; since 1.15 it also turns gradient checkpointing off for the
# generation and back on after it, with the `gradient_checkpointing_kwargs` it is given (`unwrapped_for_generation`).
from trl.models.utils import unwrap_model_for_generation

# TRL's `trainer.utils.nanstd` (since 0.17): the std of the non-NaN values, with Bessel's correction, as GRPOTrainer
# scales its advantages and logs `reward_std`. `create_model_from_path` (since 0.24): a model id or folder -> the
# model, loaded as GRPOTrainer loads its own from `model_init_kwargs` (dtype "auto" and friends).
# `disable_dropout_in_model` (since 0.9): every `nn.Dropout` of a model at p=0, what GRPOTrainer does to its model
# under `disable_dropout` (before the role adapters exist, so they need it again).
from trl.trainer.utils import create_model_from_path, disable_dropout_in_model, nanstd

__all__ = [
    "EpochOrderSampler",
    "GLOBAL_TOKEN_LOSSES",
    "LOSS_TYPES",
    "SEQUENCE_MEAN_LOSSES",
    "TOKEN_MEAN_LOSSES",
    "TRL_VERSION",
    "LossScale",
    "aggregate_like_trl",
    "before_peft_wraps",
    "batch_importance_sampling_ratio",
    "check_lm_head_cast",
    "check_loss_type",
    "create_model_from_path",
    "disable_dropout_in_model",
    "entropy_bonus_like_trl",
    "nanstd",
    "parse_response",
    "score_like_trl",
    "unwrap_model_for_generation",
    "unwrapped_for_generation",
]

TRL_VERSION = Version(trl.__version__)


def unwrapped_for_generation(model, accelerator, *, gather_deepspeed3_params: bool, gradient_checkpointing_kwargs):
    """TRL's ``unwrap_model_for_generation`` as GRPOTrainer calls it: on TRL >= 1.15, which switches gradient
    checkpointing off around the generation and on again after, with the run's ``gradient_checkpointing_kwargs``
    (without them it comes back on with transformers' defaults, ``use_reentrant=True``, from the second rollout on);
    1.14.2 leaves checkpointing alone and takes no such argument."""
    if "gradient_checkpointing_kwargs" not in inspect.signature(unwrap_model_for_generation).parameters:
        return unwrap_model_for_generation(model, accelerator, gather_deepspeed3_params=gather_deepspeed3_params)
    return unwrap_model_for_generation(
        model,
        accelerator,
        gather_deepspeed3_params=gather_deepspeed3_params,
        gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
    )


@contextmanager
def before_peft_wraps(prepare: Callable[[torch.nn.Module], None]) -> Iterator[None]:
    """While it lasts, ``prepare(model)`` runs on the base model GRPOTrainer builds just before PEFT wraps it.

    ``GRPOTrainer.__init__`` (1.14.2 to 1.16) loads the model from its name (or takes the one given), then calls
    ``get_peft_model(model, peft_config, ...)``, imported into ``trl.trainer.grpo_trainer``; there is no hook between
    the two, so that name is wrapped for the time of the constructor and put back after."""
    from trl.trainer import grpo_trainer

    original = grpo_trainer.get_peft_model

    def prepared_then_wrapped(model, peft_config, *args, **kwargs):
        prepare(model)
        return original(model, peft_config, *args, **kwargs)

    grpo_trainer.get_peft_model = prepared_then_wrapped
    try:
        yield
    finally:
        grpo_trainer.get_peft_model = original


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


# How GRPOTrainer's `_compute_loss` reduces its `[N, C]` per-token loss to a number, by `loss_type` (the same in TRL
# 1.14.2 and 1.16; tests/trl_compat/test_trl_seam.py computes TRL's loss on a fixed example for every loss type its
# config lists and compares): the mean over the sequences of a micro-batch of each one's token mean (or token sum,
# luspo; or sum over max_completion_length, dr_grpo), the token mean of the micro-batch (bnpo), or the sum over the
# generation batch's token count (dapo, cispo, vespo).
SEQUENCE_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")  # TRL averages over the sequences of a micro-batch
TOKEN_MEAN_LOSSES = ("bnpo",)  # TRL averages over the tokens of a micro-batch
GLOBAL_TOKEN_LOSSES = ("dapo", "cispo", "vespo")  # TRL divides by the generation batch's token count
LOSS_TYPES = (*SEQUENCE_MEAN_LOSSES, *TOKEN_MEAN_LOSSES, *GLOBAL_TOKEN_LOSSES)


def check_loss_type(loss_type: str) -> None:
    """Refuse a ``loss_type`` whose reduction is not known here: TRL itself fails on one only at the first loss."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"`loss_type` must be one of {list(LOSS_TYPES)} (TRL's), got {loss_type!r}.")


def check_lm_head_cast(*, cast_lm_head_to_fp32: bool, tied_embeddings: bool) -> None:
    """Refuse what TRL's ``cast_lm_head_to_fp32`` fails on, on our always-PEFT model: an LM head tied to the input
    embeddings (Qwen3-0.6B, 1.7B and 4B are). ``GRPOTrainer.__init__`` (checked in 1.16.0) then hooks
    ``model.model.embed_tokens``, which on a ``PeftModel`` names the causal LM, not its decoder, and stops with
    ``AttributeError: ... has no attribute 'embed_tokens'``."""
    if cast_lm_head_to_fp32 and tied_embeddings:
        raise ValueError(
            f"`cast_lm_head_to_fp32=True` fails inside TRL {TRL_VERSION} when the model's LM head is tied to its "
            "embeddings (`tie_word_embeddings=True`, as in Qwen3-0.6B, 1.7B and 4B) and the model carries PEFT "
            "adapters, as every model here does. Set `cast_lm_head_to_fp32=False`, or use a model saved with an "
            "LM head of its own (`tie_word_embeddings=False`)."
        )


@dataclass(frozen=True, kw_only=True)
class LossScale:
    """How TRL scales the loss of one micro-batch (what `aggregate_like_trl` needs besides the tensors), as the
    trainer is at that micro-batch."""

    gradient_accumulation_steps: int  # the Trainer's current accumulation steps
    max_completion_length: int | None
    num_processes: int
    steps_per_generation: int
    training: bool  # the model's mode: evaluation losses are not divided by the accumulation steps


def aggregate_like_trl(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    scale: LossScale,
    num_items_in_batch: torch.Tensor | None,
) -> torch.Tensor:
    """Reduce a `[N, C]` per-token term the way TRL reduces its policy loss for ``loss_type``, as the trainer is
    at this micro-batch (``scale``); ``num_items_in_batch``: the completion tokens of the whole generation batch."""
    check_loss_type(loss_type)
    training, gradient_accumulation_steps = scale.training, scale.gradient_accumulation_steps
    accumulation = gradient_accumulation_steps if training else 1
    if loss_type in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * scale.max_completion_length) / accumulation
    if loss_type == "luspo":
        return (per_token * mask).sum(-1).mean() / accumulation
    return (per_token * mask).sum() / _tokens_per_step(scale, num_items_in_batch)  # GLOBAL_TOKEN_LOSSES


def _tokens_per_step(scale: LossScale, num_items_in_batch: torch.Tensor) -> torch.Tensor:
    """TRL's normaliser of the global-token losses: one process's share of the tokens of one optimizer step (of the
    generation batch in evaluation), so that the step's micro-batches and processes add up to a token mean."""
    normalizer = num_items_in_batch.clamp(min=1.0) / scale.num_processes
    if scale.training:
        normalizer = normalizer * scale.gradient_accumulation_steps / scale.steps_per_generation
    return normalizer


def entropy_bonus_like_trl(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    kept: torch.Tensor,
    coefficients: torch.Tensor,
    *,
    scale: LossScale,
    num_items_in_batch: torch.Tensor,
) -> torch.Tensor:
    """TRL's entropy bonus (``entropy_coef``, subtracted from the loss) of one loss forward, with a coefficient per
    sample (``coefficients`` `[N]`): the mean per-token entropy of the ``kept`` tokens (`[N, C]`: the completion
    ``mask``, or TRL's high-entropy tokens under ``top_entropy_quantile``), whatever the loss type.

    GRPOTrainer (1.16) takes that mean over each micro-batch and divides it by the accumulation steps. Here a
    micro-batch may be cut into several forwards (one per adapter, or by ``max_tokens_per_micro_batch``), so each
    forward's mean weighs by its share of the optimizer step's completion tokens (as TRL's ``dapo`` reduction
    counts them): the same as TRL's when every micro-batch holds its equal share of the tokens, and independent of
    how the samples are cut into forwards."""
    mean = (coefficients.unsqueeze(1) * entropies * kept).sum() / kept.sum().clamp(min=1.0)
    return mean * mask.sum() / _tokens_per_step(scale, num_items_in_batch)


def batch_importance_sampling_ratio(batch, args) -> torch.Tensor:
    """TRL's correction for the gap between the rollout engine's sampling policy and the trained one, as
    ``GRPOTrainer._generate_and_score_completions`` computes it for vLLM rollouts (since 0.23; the four modes since
    0.25), with the ``vllm_importance_sampling_*`` settings of ``args``.

    ``batch`` holds ``old_per_token_logps``, ``sampling_per_token_logps`` and ``completion_mask`` (``[N, C]``); the
    ratio is ``[N, C]`` for the token modes, ``[N, 1]`` for the sequence modes. "truncate" clamps to
    [clip_min, clip_max], "mask" zeroes the ratios outside; a NaN sampling log-prob counts as no gap. TRL computes it
    inline, so there is nothing to call: tests/trl_compat/test_trl_seam.py runs TRL's own method on the same inputs
    for every mode and compares.
    """
    mode = args.vllm_importance_sampling_mode
    clip_min, clip_max = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
    gap = (batch.old_per_token_logps - batch.sampling_per_token_logps) * batch.completion_mask
    diff = torch.nan_to_num(gap, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


class EpochOrderSampler(torch.utils.data.Sampler):
    """TRL's ``RepeatSampler`` (``sampler``), made to give the pass over the data of epoch ``e`` the order an
    uninterrupted run gives it, whichever passes this process ran before. The epoch of a pass: the last
    ``set_epoch(e)``, or ``epoch_now()`` (the Trainer's own count) when none reached this sampler yet.

    ``RepeatSampler`` (trl/trainer/utils.py, the same from 1.14.2 to 1.16 and on TRL's main) seeds a generator of its
    own once, in ``__init__``, and draws a new permutation as each pass starts (``__iter__``); it has no
    ``set_epoch`` and nothing saves its generator. An uninterrupted run's epoch ``e`` gets the generator's
    ``e+1``-th draw. A run resumed from a checkpoint of epoch ``e >= 1`` builds a fresh sampler, and the Trainer
    starts its loop at epoch ``e`` without passing over the epochs before (transformers trainer.py,
    ``_inner_training_loop``: ``for epoch in range(epochs_trained, num_train_epochs)``; ``_run_epoch`` skips batches
    of the resumed epoch only): that epoch got the first draw, epoch 0's order (all of it after a checkpoint at an
    epoch's end, its remaining batches after one in mid-epoch). Here each pass puts the generator back to its seeded
    state and draws, then drops, the orders of the epochs before.

    The Trainer calls ``set_epoch(epoch)`` on its data loader before each epoch's pass (``_run_epoch``), which
    accelerate's ``DataLoaderShard.set_epoch`` hands on to a sampler at most two batch samplers down. Under several
    processes, the loader that skips a resumed epoch's first batches holds the sampler three down (``SkipBatchSampler``
    over ``BatchSamplerShard`` over ``BatchSampler``; accelerate 1.16), and its ``set_epoch`` never arrives: that first
    pass takes ``epoch_now()``.
    """

    def __init__(self, sampler: torch.utils.data.Sampler, epoch_now: Callable[[], int]):
        self.sampler, self.epoch_now = sampler, epoch_now
        generator = getattr(sampler, "generator", None)  # only a shuffling RepeatSampler has one
        self._seeded = generator.get_state() if generator is not None else None  # before its first draw
        self.epoch: int | None = None  # the epoch of the next pass, once set_epoch has said it

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch_now() if self.epoch is None else self.epoch
        if self._seeded is not None:
            self.sampler.generator.set_state(self._seeded)
            for _ in range(epoch):
                next(iter(self.sampler), None)  # a pass draws its whole order as it starts
        self.epoch = epoch + 1  # a next pass without set_epoch draws the next order, as RepeatSampler's own would
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)
