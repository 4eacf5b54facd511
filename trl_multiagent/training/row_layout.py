"""The rows of a training forward as the model receives them: without an attention mask, so that no forward pays
for a padded square.

TRL lays a forward out as left-padded prompts followed by right-padded completions, ``[N, P + C]``, with an attention
mask. transformers hands the attention a 4-D mask as soon as one row is padded, and SDPA's masked kernels then
compute every (query, key) pair of the row's width, ``W^2``, where its causal (flash) kernel computes the
``W (W + 1) / 2`` a causal mask keeps; and every padding column is computed as a token. Here a forward carries no mask:

- **start-aligned** (`"rows"`, any attention implementation): one sample a row, its tokens first, padding after.
  Under causal attention a token attends only to the columns before it, all its own sample's, so the model runs
  without a mask (SDPA's causal kernel) and the padding at the end of a row changes nothing before it. Rows grouped
  by length (``mini_batches.row_groups``) pad little.
- **packed** (`"packed"`, where the attention implementation handles packing without a dense mask:
  ``PACKING_ATTENTION``): a forward's samples one after another in one row (one row per adapter the samples are
  routed to: LoRA routing goes by row), position ids restarting at each.
  transformers reads the samples' boundaries from the position ids (flash attention's varlen kernel, flex attention's
  block mask): no padding, and each sample's own causal square. SDPA and eager attention would get a dense
  block-diagonal mask instead, the whole square again, so they take start-aligned rows.

A MoE model whose router loss TRL computes (`compute_aux_loss`) keeps the padding mask in start-aligned rows: that
loss averages over the tokens the mask marks.

TRL's log-prob computation runs unchanged on the laid-out rows: it reads the mask it is given to choose the tokens
to score (``labels``), so it is given the mask of the completion tokens (TRL 1.16's fused LM head, on a GPU, scores
those alone), while the model (`LaidOut.model`) gets the layout's own mask (none) and position ids. Only the places of
a sample's tokens change, not their positions within the sample: the log-probs are TRL's up to floating-point
rounding. Its ``[R, K]`` outputs are read back into TRL's completion columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

LAYOUTS = ("rows", "packed")
PACKING_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


def layout_for(attn_implementation: str | None) -> str:
    """The layout of a model's training forwards: packed where its attention reads packed samples from position ids
    without a dense mask (the `kernels-community` flash kernels too), one sample a row elsewhere."""
    name = attn_implementation or ""
    if name in PACKING_ATTENTION or name.startswith("kernels-community/flash-attn"):
        return "packed"
    return "rows"


def rows_by_adapter(names: Sequence[str]) -> tuple[list[str], list[int]]:
    """Packed rows of a forward whose samples go through ``names``: each row's adapter (LoRA routing goes by row)
    and each sample's row."""
    row_names = list(dict.fromkeys(names))
    return row_names, [row_names.index(name) for name in names]


def padded_width(width: int, multiple: int | None) -> int:
    """``width`` rounded up to a multiple of ``multiple`` (`pad_to_multiple_of`), unchanged without one."""
    return width if not multiple else -(-width // multiple) * multiple


@dataclass(frozen=True)
class LaidOut:
    """One forward's samples laid out, and where each of TRL's completion columns went."""

    input_ids: torch.Tensor  # [R, W] the samples' own tokens (rows: one sample a row, first; packed: a row a group)
    scored: torch.Tensor  # [R, W] 1 on the completion tokens (the mask TRL reads to pick the tokens it scores)
    attention_mask: torch.Tensor | None  # [R, W] what reaches the model: None, or the padding mask (router loss)
    position_ids: torch.Tensor | None  # [R, W] packed: restarting at each sample; None: 0..W-1 on every row
    logits_to_keep: int  # K: every scored token lies in the last K columns
    index: torch.Tensor  # [N, C] where each completion column's value lies in the flattened [R, K] outputs
    kept: torch.Tensor  # [N, C] bool: the completion columns that hold a token of the sample (attention mask 1)

    @classmethod
    def of(
        cls,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_width: int,
        *,
        layout: str = "rows",
        pad_to_multiple_of: int | None = None,
        padding_mask: bool = False,
        pad_token_id: int = 0,
        row_of: Sequence[int] | None = None,
    ) -> LaidOut:
        """``input_ids`` and ``attention_mask`` in TRL's layout (``[N, P + C]``, the completions in the last
        ``completion_width`` = C columns) laid out as ``layout`` says, each forward's width a multiple of
        ``pad_to_multiple_of`` where given; ``padding_mask``: start-aligned rows that keep their padding mask;
        ``row_of``: packed, the row of each sample (0, 1, ... in order; one row for all without it). A
        token is a sample's own where the mask is 1; masked tokens (a completion masked whole, e.g. under
        ``mask_truncated_completions``) are left out as padding is."""
        if layout not in LAYOUTS:
            raise ValueError(f"A forward's layout is one of {LAYOUTS}, got {layout!r}.")
        packed = layout == "packed" and not padding_mask
        own = attention_mask.bool()
        counts = own.sum(dim=1)  # [N] tokens of each sample
        first = input_ids.size(1) - completion_width  # TRL's first completion column
        completion = own.clone()
        completion[:, :first] = False
        prompt_tokens = own[:, :first].sum(dim=1)
        if bool(((prompt_tokens == 0) & completion.any(dim=1)).any()):
            raise ValueError(
                "A sample with completion tokens has no prompt token before them: its first completion token has "
                "nothing to be predicted from. Every training sample needs a prompt."
            )
        rank = own.cumsum(dim=1) - 1  # [N, P + C] place of each own token within its sample
        if packed:
            groups = [0] * len(counts) if row_of is None else list(row_of)
            rows = max(groups, default=0) + 1
            filled, starts = [0] * rows, []  # tokens of each row so far; where each sample begins in its row
            for group, count in zip(groups, counts.tolist()):
                starts.append(filled[group])
                filled[group] += count
            row = torch.as_tensor(groups, device=rank.device).unsqueeze(1).expand_as(rank)
            column = torch.as_tensor(starts, device=rank.device).unsqueeze(1) + rank
            width = max(filled)
        else:
            row = torch.arange(len(counts), device=counts.device).unsqueeze(1).expand_as(rank)
            column = rank
            rows, width = len(counts), int(counts.max()) if len(counts) else 0
        width = padded_width(max(width, 2), pad_to_multiple_of)  # TRL shifts by one column: at least two
        laid_ids = torch.full((rows, width), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
        laid_own = torch.zeros((rows, width), dtype=torch.bool, device=input_ids.device)
        laid_scored = torch.zeros((rows, width), dtype=attention_mask.dtype, device=attention_mask.device)
        laid_ids[row[own], column[own]] = input_ids[own]
        laid_own[row[own], column[own]] = True
        laid_scored[row[completion], column[completion]] = 1
        position_ids = None
        if packed:  # each sample from 0; the padding after a row's last sample counts as one more sample
            position_ids = torch.zeros((rows, width), dtype=torch.long, device=input_ids.device)
            position_ids[row[own], column[own]] = rank[own]
            for r, tail in enumerate(filled):
                position_ids[r, tail:] = torch.arange(width - tail, device=input_ids.device)
        scored_columns = column[completion]
        earliest = int(scored_columns.min()) if len(scored_columns) else width - 1
        keep = width - earliest
        kept = completion[:, first:]
        index = row[:, first:] * keep + column[:, first:] - (width - keep)
        return cls(
            input_ids=laid_ids,
            scored=laid_scored,
            attention_mask=laid_own.to(attention_mask.dtype) if padding_mask else None,
            position_ids=position_ids,
            logits_to_keep=keep,
            index=torch.where(kept, index, 0),
            kept=kept,
        )

    def model(self, model):
        """``model`` as TRL's log-prob computation calls it, given this layout's mask and position ids in place
        of the mask TRL passes (the tokens it scores)."""
        return _WithLayout(model, self.attention_mask, self.position_ids)

    def completion_values(self, values: torch.Tensor | None) -> torch.Tensor | None:
        """`[R, K]` per-token values of the laid-out forward (its last K columns, as TRL returns them) in TRL's
        completion columns, `[N, C]`; 0 where a completion column holds no token of its sample."""
        if values is None:
            return None
        return torch.where(self.kept, values.reshape(-1)[self.index], 0.0)


class _WithLayout:
    """A model called with the layout's attention mask and position ids, whatever mask its caller passes."""

    def __init__(self, model, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None):
        self.module, self.attention_mask, self.position_ids = model, attention_mask, position_ids

    def __call__(self, *args, attention_mask=None, **kwargs):
        if self.position_ids is not None:
            kwargs["position_ids"] = self.position_ids
        return self.module(*args, attention_mask=self.attention_mask, **kwargs)
