"""What a training step actually ran, read from the model as it runs (not predicted from the trainer's settings): each
forward's rows and widths, its real tokens, whether a mask reached attention and which attention kernel ran, the
linear layers' and attention's FLOPs as executed, recompute under gradient checkpointing, and the LoRA weights' dtype.

Hooks record every call of every ``nn.Linear`` (base, LoRA and LM head: ``2 x inputs x out_features`` FLOPs, as it
ran, padding included), every attention module (its query width and the mask it was given) and the model's own
forward (its ``input_ids`` and ``attention_mask``). TRL's fused LM head (``fused_lm_head=True``: the projection and
log-softmax in tiles, never through the ``nn.Linear``) is counted from the positions it is handed, with its backward
that recomputes each tile. A call made while the trainer runs backward is recompute. The
backward's FLOPs are counted from the forward that built the graph: each linear call's input gradient when its input
needed one and its weight gradient when its weight is trained (LoRA), attention twice its forward, as
``model_flops.py`` counts. Attention's FLOPs follow the mask that reached it:

- no mask (SDPA's causal kernel, or flash attention's varlen rows): the ``n (n + 1) / 2`` query-key pairs of each
  sample a causal kernel visits;
- a dense mask (any padded row with SDPA or eager): the full ``width^2`` square of every row, as the masked kernels
  compute it;
- flex attention's block mask: the blocks it computes (``1 - sparsity``) of the full square.

The attention kernel is read once per forward, in its first attention layer, from the operation dispatched (flash,
efficient, cuDNN, flash-for-CPU, flex; none of these: math).
"""

from __future__ import annotations

import inspect
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

KERNELS = {  # an aten operation that SDPA dispatches -> the backend that ran
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_flash_attention_forward": "flash",
    "_efficient_attention_forward": "efficient",
    "_fused_sdp_choice": None,
}


@dataclass
class PhaseWork:
    """What one phase of a step (the log-prob forwards before the update, the loss forwards, backward) ran."""

    forwards: int = 0
    widths: list[tuple[int, int]] = field(default_factory=list)  # (rows, width) of each forward
    real_tokens: int = 0
    padded_tokens: int = 0  # positions computed that hold no token
    squared_lengths: int = 0  # sum over samples of (sample length)^2: what causal attention's cost grows with
    masks: Counter = field(default_factory=Counter)  # attention calls per mask that reached them
    kernels: Counter = field(default_factory=Counter)  # forwards per attention kernel that ran
    linear_flops: float = 0.0
    attention_flops: float = 0.0
    backward_flops: float = 0.0  # of this phase's forwards, counted from the graph they built
    recompute_flops: float = 0.0  # forwards run again during backward (gradient checkpointing)
    recomputed_layers: int = 0
    lm_head_positions: int = 0  # positions projected onto the vocabulary
    padding_flops: float = 0.0  # linear layers' work (and its backward) on positions that hold no token
    attention_beyond_causal_flops: float = 0.0  # attention (and its backward) beyond each sample's causal triangle

    def waste(self) -> dict:
        """Where this phase's executed FLOPs went beyond the samples' own work, in TFLOP (recompute counted once)."""
        return {
            "recompute": round(self.recompute_flops / 1e12, 4),
            "padding_in_linear_layers": round(self.padding_flops / 1e12, 4),
            "attention_beyond_causal": round(self.attention_beyond_causal_flops / 1e12, 4),
        }

    def executed_flops(self) -> float:
        return self.linear_flops + self.attention_flops + self.backward_flops + self.recompute_flops

    def figures(self) -> dict:
        widths = Counter(f"{rows}x{width}" for rows, width in self.widths)
        return {
            "forwards": self.forwards,
            "forward_shapes": dict(sorted(widths.items())),  # rows x width: count
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "sum_squared_sample_lengths": self.squared_lengths,
            "attention_masks": dict(self.masks),
            "attention_kernels": dict(self.kernels),
            "recomputed_layers": self.recomputed_layers,
            "lm_head_positions": self.lm_head_positions,
            "executed_tflop": round(self.executed_flops() / 1e12, 4),
            "waste_tflop": self.waste(),
        }


class ExecutedWork:
    """Records what the model runs while ``phase()`` names a training phase; ``phases`` holds each one's work since
    the last ``reset()``. ``phase`` is a callable returning the name of the phase running now (or ``None``)."""

    def __init__(self, model: torch.nn.Module, phase):
        self.phase = phase
        self.base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = self.base.config
        self.phases: dict[str, PhaseWork] = defaultdict(PhaseWork)
        self.handles = []
        self._probe: KernelProbe | None = None
        self._first_attention = False
        self._attention_inputs = None  # (mask, position ids, (rows, width), what attended_pairs made of them)
        self._padded_share, self._causal_pairs = 0.0, 0.0  # of the forward running now
        self.handles.append(self.base.register_forward_pre_hook(self._model_called, with_kwargs=True))
        for module in self.base.modules():
            if isinstance(module, torch.nn.Linear):
                self.handles.append(module.register_forward_hook(self._linear_called))
        self._fused_head = self._count_fused_head()
        for name, module in self.base.named_modules():
            if name.endswith("self_attn"):
                self.handles.append(module.register_forward_pre_hook(self._attention_called, with_kwargs=True))
                self.handles.append(module.register_forward_hook(self._attention_done))

    def reset(self) -> None:
        self.phases = defaultdict(PhaseWork)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self._fused_head is not None:
            module, original = self._fused_head
            module._ChunkedLogProbFunction = original
            self._fused_head = None

    def _count_fused_head(self):
        """Wrap TRL's fused LM head (its chunked log-prob function) so each call's positions are counted; returns
        what to restore, or ``None`` where TRL has none."""
        try:
            from trl.trainer import utils as trl_utils

            original = trl_utils._ChunkedLogProbFunction
        except (ImportError, AttributeError):
            return None
        work_now = self._work

        class CountedHead:
            @staticmethod
            def apply(hidden, weight, *args):
                work, recompute = work_now()
                if work is not None:
                    flops = 2.0 * hidden.shape[0] * weight.shape[0] * weight.shape[1]
                    work.lm_head_positions += hidden.shape[0]
                    work.linear_flops += flops
                    if torch.is_grad_enabled():  # its backward recomputes each tile, then the gradients
                        work.backward_flops += flops * (1 + hidden.requires_grad + weight.requires_grad)
                return original.apply(hidden, weight, *args)

        trl_utils._ChunkedLogProbFunction = CountedHead
        return trl_utils, original

    def lora_dtypes(self) -> list[str]:
        dtypes = {str(p.dtype).removeprefix("torch.") for n, p in self.base.named_parameters() if "lora_" in n}
        return sorted(dtypes)

    def checkpointing_enabled(self) -> bool:
        return bool(getattr(self.base, "is_gradient_checkpointing", False))

    # ------------------------------------------------------------------------------------------------------ hooks
    def _work(self) -> tuple[PhaseWork | None, bool]:
        """The work of the phase running now, and whether it is a recompute (a forward run during backward)."""
        phase = self.phase()
        if phase is None or phase == "rollout":
            return None, False
        if phase == "backward":
            return self.phases["loss_forward"], True
        return self.phases[phase], False

    def _model_called(self, module, args, kwargs):
        work, recompute = self._work()
        if work is None or recompute:
            return
        kwargs = named(module, args, kwargs)
        input_ids = kwargs.get("input_ids")
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if input_ids is None:
            input_ids = kwargs["inputs_embeds"][..., 0]
        rows, width = input_ids.shape[:2]
        lengths = sample_lengths(rows, width, mask, positions)
        if mask is None and lengths == [width] * rows:  # one sample a row, padded after it: the padding is not masked
            lengths = unpadded_lengths(input_ids, self.config.pad_token_id)
        work.forwards += 1
        work.widths.append((rows, width))
        work.real_tokens += sum(lengths)
        work.padded_tokens += rows * width - sum(lengths)
        work.squared_lengths += sum(n * n for n in lengths)
        self._padded_share = 1 - sum(lengths) / (rows * width) if rows * width else 0.0
        self._causal_pairs = sum(n * (n + 1) / 2 for n in lengths)  # what each attention layer needs of this forward
        self._first_attention = True
        self._attention_inputs = None  # the last forward's mask can go

    def _linear_called(self, module, inputs, output):
        work, recompute = self._work()
        if work is None:
            return
        (x,) = inputs[:1]
        flops = 2.0 * x.numel() * module.out_features
        if recompute:
            work.recompute_flops += flops
            return
        work.linear_flops += flops
        backward = flops * (x.requires_grad + module.weight.requires_grad) if torch.is_grad_enabled() else 0.0
        work.backward_flops += backward  # the graph's: input gradient if needed, weight gradient if trained
        if module.out_features == self.config.vocab_size:
            work.lm_head_positions += x.numel() // x.shape[-1]
        else:  # the LM head's positions are chosen (completion tokens), the layers' include the padding
            work.padding_flops += (flops + backward) * self._padded_share

    def _attention_called(self, module, args, kwargs):
        work, recompute = self._work()
        if work is None:
            return
        kwargs = named(module, args, kwargs)
        rows, width = kwargs["hidden_states"].shape[:2]
        kind, pairs = self._attended(rows, width, kwargs)
        heads, head_dim = self.config.num_attention_heads, attention_head_dim(self.config)
        flops = 4.0 * pairs * heads * head_dim  # scores and weighted values, a multiply-add each
        if recompute:
            work.recompute_flops += flops
            work.recomputed_layers += 1
            return
        work.masks[kind] += 1
        work.attention_flops += flops
        backward = 2 * flops if torch.is_grad_enabled() else 0.0
        work.backward_flops += backward
        needed = 4.0 * self._causal_pairs * heads * head_dim
        work.attention_beyond_causal_flops += max(flops - needed, 0.0) * (3 if backward else 1)  # with its backward
        if self._first_attention:  # read the kernel in each forward's first attention layer
            self._first_attention = False
            self._probe = KernelProbe()
            self._probe.__enter__()

    def _attended(self, rows: int, width: int, kwargs: dict) -> tuple[str, float]:
        """``attended_pairs``, read once per forward: every layer gets the same mask and positions, and reading a
        packed row's lengths or a block mask's sparsity waits for the GPU."""
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        seen = self._attention_inputs
        if seen is None or seen[0] is not mask or seen[1] is not positions or seen[2] != (rows, width):
            seen = self._attention_inputs = (mask, positions, (rows, width), attended_pairs(rows, width, mask, kwargs))
        return seen[3]

    def _attention_done(self, module, args, output):
        if self._probe is None:
            return
        probe, self._probe = self._probe, None
        probe.__exit__(None, None, None)
        work, _ = self._work()
        if work is not None:
            work.kernels[probe.kernel()] += 1


class KernelProbe(TorchDispatchMode):
    """The attention operations dispatched inside one attention layer."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if "attention" in name or name.startswith("flex"):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))

    def kernel(self) -> str:
        for name in self.seen:
            if KERNELS.get(name):
                return KERNELS[name]
            if "flex" in name:
                return "flex"
        return "math (no fused kernel: " + (", ".join(self.seen) or "matmul and softmax") + ")"


def named(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """A forward's arguments by name, however they were passed."""
    if not args:
        return kwargs
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    return {**bound.pop("kwargs", {}), **bound}


def attention_head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sample_lengths(rows: int, width: int, mask, positions) -> list[int]:
    """The length of each sample a forward holds: a row's unmasked tokens, or, in rows packed with several samples
    (no mask, position ids restarting at 0), each run of positions."""
    if mask is None and positions is not None and rows * width and bool((positions[:, 1:] == 0).any()):
        lengths = []
        for row in positions.tolist():
            starts = [i for i, p in enumerate(row) if p == 0] + [len(row)]
            lengths += [b - a for a, b in zip(starts, starts[1:])]
        return lengths
    if mask is None:
        return [width] * rows
    return mask.sum(dim=-1).tolist()


def unpadded_lengths(input_ids: torch.Tensor, pad_token_id: int | None) -> list[int]:
    """Each row's length without the padding after its sample: rows laid out one sample a row carry no mask (the
    causal kernel leaves the tail unread), so the padding is told by the pad token, from the row's end."""
    if pad_token_id is None:
        return [input_ids.size(1)] * input_ids.size(0)
    own = (input_ids != pad_token_id).int()
    last = own.size(1) - own.flip(dims=[1]).argmax(dim=1)  # one past each row's last token that is not padding
    return torch.where(own.any(dim=1), last, 0).tolist()


def attended_pairs(rows: int, width: int, mask, kwargs) -> tuple[str, float]:
    """(the kind of mask that reached attention, the query-key pairs its kernel computes)."""
    causal = width * (width + 1) / 2
    if mask is None:
        starts = kwargs.get("cu_seq_lens_q")
        if starts is not None:  # flash attention's varlen rows: each sample's own causal triangle
            lengths = (starts[1:] - starts[:-1]).tolist()
            return "none (varlen)", sum(n * (n + 1) / 2 for n in lengths)
        positions = kwargs.get("position_ids")
        if positions is not None and bool((positions[:, 1:] == 0).any()):  # packed rows, no mask
            lengths = sample_lengths(rows, width, None, positions)
            return "none (packed)", sum(n * (n + 1) / 2 for n in lengths)
        return "none (causal kernel)", rows * causal
    if hasattr(mask, "sparsity"):  # flex attention's BlockMask: the blocks it visits
        return "block mask (flex)", rows * width * width * (1 - mask.sparsity() / 100)
    if isinstance(mask, torch.Tensor):
        return f"dense {mask.dim()}-D mask", rows * width * width
    return type(mask).__name__, rows * width * width
