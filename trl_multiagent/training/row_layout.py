"""The rows of a training forward end-aligned: each row's tokens at its right end, all its padding on its left.

TRL lays a forward out as left-padded prompts followed by right-padded completions, ``[N, P + C]``: a row pays for
the longest prompt and the longest completion of its forward, padding on both sides of its own tokens. In one
Eval-Opt forward a generator's first attempt (short prompt, long completion) beside an evaluator call (long prompt,
short verdict) makes most of that width padding. End-aligned, a forward is only as wide as its longest row,
``max(prompt + completion)``, and rows of similar lengths (``mini_batches.row_groups`` forms forwards so) pad little.

Every completion still ends a row, so the last ``C`` columns hold every completion token and TRL's log-prob
computation runs unchanged (``logits_to_keep=C``, attention mask as padding mask, on every attention
implementation); its ``[N, C]`` outputs are read back into TRL's completion columns. Only the positions of a row's
tokens move, all by the same amount: rotary position embeddings depend on relative positions alone, so the log-probs
are TRL's up to floating-point rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EndAligned:
    """One forward's rows end-aligned, and where each of TRL's completion columns went."""

    input_ids: torch.Tensor  # [N, W] each row's own tokens last, in order; W = max(longest row, C + 1)
    attention_mask: torch.Tensor  # [N, W]
    columns: torch.Tensor  # [N, C] where each completion column's token is among the last C columns (0 if padding)
    kept: torch.Tensor  # [N, C] bool: the completion columns that hold a token of the row (attention mask 1)

    @classmethod
    def of(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_width: int) -> EndAligned:
        """``input_ids`` and ``attention_mask`` in TRL's layout (``[N, P + C]``, the completions in the last
        ``completion_width`` = C columns) end-aligned. A token is a row's own where the mask is 1; padding, masked
        tokens included (a completion masked whole, e.g. under ``mask_truncated_completions``), moves left."""
        mask = attention_mask.bool()
        own = mask.sum(dim=1)  # [N] tokens of each row
        # TRL's forward reads the logits before each of the last C columns, so it needs C + 1 columns: when every
        # completion as long as the forward's is masked whole, the longest row may be narrower than that.
        width = max(int(own.max()), completion_width + 1) if len(own) else completion_width + 1
        rank = mask.cumsum(dim=1) - 1  # [N, P + C] place of each own token among its row's own tokens
        column = width - own.unsqueeze(1) + rank  # [N, P + C] its column once end-aligned (own tokens only)
        rows = torch.arange(len(own), device=own.device).unsqueeze(1).expand_as(mask)
        aligned_ids = torch.zeros((len(own), width), dtype=input_ids.dtype, device=input_ids.device)
        aligned_mask = torch.zeros((len(own), width), dtype=attention_mask.dtype, device=attention_mask.device)
        aligned_ids[rows[mask], column[mask]] = input_ids[mask]
        aligned_mask[rows[mask], column[mask]] = 1
        kept = mask[:, input_ids.size(1) - completion_width :]
        columns = column[:, input_ids.size(1) - completion_width :] - (width - completion_width)
        return cls(aligned_ids, aligned_mask, torch.where(kept, columns, 0), kept)

    def completion_values(self, values: torch.Tensor | None) -> torch.Tensor | None:
        """`[N, C]` per-token values of the end-aligned forward (its last C columns, as TRL returns them) in TRL's
        completion columns; 0 where a completion column holds no token of its row."""
        if values is None:
            return None
        return torch.where(self.kept, values.gather(1, self.columns), 0.0)
