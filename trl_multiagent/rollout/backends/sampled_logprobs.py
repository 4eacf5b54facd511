"""The log-prob of each token ``generate`` samples, as TRL scores a completion token: the model's logits at that step
divided by the temperature, log-softmax over the whole vocabulary (no top-k / top-p renormalisation), read one step at
a time instead of keeping every step's logits (``output_logits`` would hold steps x rows x vocabulary floats).

vLLM's ``processed_logprobs`` (what the vLLM backends report) are the same numbers while no top-k, top-p, min-p or
penalty truncates or shifts the distribution; with one, vLLM's are renormalised over the tokens it kept and TRL's are
not."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor


class SampledTokenLogprobs(LogitsProcessor):
    """Given to ``generate`` as a ``logits_processor``, it runs after the processors that change the logits
    (repetition penalty, bad words: none under TRL's defaults) and before the sampling warpers (temperature, top-k,
    top-p, min-p), so it sees the model's own logits. It keeps one step's log-softmax, `[B, V]` in float32, and reads
    the sampled token's from it at the next step, once that token is the last column of ``input_ids``;
    ``of(generated)`` reads the last step's and returns every generated token's, `[B, T]`."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self._last: torch.Tensor | None = None  # [B, V] log-probs of the step before
        self._read: list[torch.Tensor] = []  # one [B] per step read so far

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last is not None:
            self._read.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        self._last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def of(self, generated: torch.Tensor) -> torch.Tensor:
        """`[B, T]` log-probs of ``generated`` (`[B, T]`, the tokens ``generate`` appended to the prompts)."""
        steps = list(self._read)
        if self._last is not None:
            steps.append(self._last.gather(1, generated[:, -1:]).squeeze(1))
        if len(steps) != generated.size(1):  # generate called the processors once per new token until now
            raise RuntimeError(
                f"generate appended {generated.size(1)} tokens but scored {len(steps)} steps: the sampled tokens' "
                "log-probs cannot be read from this generation (assisted or speculative decoding?)."
            )
        self._last, self._read = None, []
        if not steps:
            return torch.zeros(generated.shape, dtype=torch.float32, device=generated.device)
        return torch.stack(steps, dim=1)
