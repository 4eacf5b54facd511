"""Rollouts with transformers ``generate``: one left-padded batch per tick, adapters mixed per sample."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import LogitsProcessorList

from ...adapters.routing import BASE_MODEL, AdapterRouter
from ..chat_rendering import ChatRenderer
from ..padding import padded
from .base import GenerationRequest, GenerationResult, Provenance, RendersPrompts, settings_key
from .sampled_logprobs import SampledTokenLogprobs

logger = logging.getLogger(__name__)

# GenerationRequest.generation_kwargs names (vLLM's) -> GenerationConfig fields
_CONFIG_FIELDS = {"max_tokens": "max_new_tokens", "stop": "stop_strings"}


def token_bounded_batches(
    prompt_lengths: list[int], max_new_tokens: int, rows_per_prompt: int, *, max_rows: int, max_tokens: int
) -> list[list[int]]:
    """Positions in ``prompt_lengths`` grouped into generate calls, shortest prompts first: at most ``max_rows``
    prompts each, and ``rows_per_prompt`` x prompts x (longest prompt + ``max_new_tokens``), the KV cache the call
    can reach, at most ``max_tokens``. A prompt over the budget on its own is a call of its own."""
    batches: list[list[int]] = []
    for position in sorted(range(len(prompt_lengths)), key=prompt_lengths.__getitem__):
        batch = batches[-1] if batches else []
        width = prompt_lengths[position]  # the longest so far: positions come shortest first
        fits = len(batch) < max_rows and rows_per_prompt * (len(batch) + 1) * (width + max_new_tokens) <= max_tokens
        if batch and fits:
            batch.append(position)
        else:
            batches.append([position])
    return batches


class TransformersBackend(RendersPrompts):
    """Generates with ``model.generate``; ``unwrapped_model()`` yields the model ready for generation.

    The trainer passes TRL's ``unwrap_model_for_generation`` here, so DeepSpeed ZeRO-3 parameters are gathered
    once per batch rather than once per token. Requests carrying ``generation_kwargs`` (a role's own sampling
    settings) are generated in batches of their own, with ``generation_config`` updated by them. Prompts are rendered
    by ``chat_rendering`` (``"tokenizer"``: the chat template with ``chat_template_kwargs``; ``"reference_qwen"``:
    the reference stack's Qwen rendering; see ``rollout.chat_rendering``). Each ``generate``
    holds at most ``max_batch_size`` prompts and, with ``max_batch_tokens``, at most that many tokens of KV cache:
    rows x (longest prompt + max new tokens); a group over the budget is cut with its prompts taken shortest first,
    so that similar lengths pad together. ``weights_step()``, if given, is the optimizer step of the model's weights
    now (the trainer's ``global_step``); each result's ``provenance`` carries it, with the adapter it was routed to.
    With ``continuous_batching`` (a ``ContinuousBatchingConfig``: TRL's ``use_transformers_continuous_batching``),
    each adapter's requests of a group go to ``generate_batch`` instead, which packs them without padding and sizes
    its own paged KV cache; one adapter per call, as it flattens the rows that per-sample routing tells apart.
    With ``report_logprobs`` (the trainer's `old_logprobs="rollout"`), each result carries the sampled tokens'
    log-probs as TRL scores them (``sampled_logprobs.py``); not with continuous batching or beams.
    """

    def __init__(
        self,
        unwrapped_model: Callable[[], AbstractContextManager[torch.nn.Module]],
        tokenizer,
        router: AdapterRouter,
        generation_config,
        eos_token_ids: Sequence[int],
        chat_template_kwargs: dict[str, Any] | None = None,
        max_batch_size: int | None = None,
        chat_rendering: str = "tokenizer",
        max_batch_tokens: int | None = None,
        weights_step: Callable[[], int] | None = None,
        continuous_batching=None,
        report_logprobs: bool = False,
    ):
        if report_logprobs and continuous_batching is not None:
            raise ValueError(
                "The transformers backend reports the sampled tokens' log-probs from `generate` only; continuous "
                "batching (`generate_batch`) returns none. Turn use_transformers_continuous_batching off, or set "
                "old_logprobs='recompute'."
            )
        self.report_logprobs = report_logprobs
        self.continuous_batching = continuous_batching
        self.weights_step = weights_step
        self.unwrapped_model = unwrapped_model
        self.tokenizer = tokenizer
        self.router = router
        self.generation_config = generation_config
        self.eos_token_ids = set(eos_token_ids)
        self.renderer = ChatRenderer(tokenizer, chat_rendering, chat_template_kwargs)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens

    def tokenize(self, messages) -> list[int]:
        return self.renderer.prompt_ids(messages)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        prompts = self.prompt_ids_of(requests)
        groups: dict[tuple, list[int]] = {}  # requests with the same settings generate together
        # LoRA on MoE expert weights, and continuous batching, see the rows flattened: one adapter per call
        continuous = self.continuous_batching is not None
        one_adapter_per_batch = continuous or not getattr(self.router, "mixes_adapters", True)
        for i, request in enumerate(requests):
            key = settings_key(request.generation_kwargs), request.adapter if one_adapter_per_batch else None
            groups.setdefault(key, []).append(i)
        results: list[GenerationResult | None] = [None] * len(requests)
        version = self.weights_step() if self.weights_step is not None else None  # the live weights generate
        with self.unwrapped_model() as model:
            was_training = model.training
            if was_training:  # each switch walks every module: a model in eval mode already (evaluation) stays
                model.eval()
            try:
                for indices in groups.values():
                    config = self.config_for(requests[indices[0]].generation_kwargs)
                    generate = self._generate_continuous if continuous else self._generate_batch
                    for chunk in [indices] if continuous else self._batches(indices, prompts, config):
                        adapters = [requests[i].adapter for i in chunk]
                        batch = generate(model, [prompts[i] for i in chunk], adapters, config)
                        for i, adapter, result in zip(chunk, adapters, batch):
                            trained = adapter != BASE_MODEL  # the base model's weights have no optimizer step
                            result.provenance = Provenance(adapter, version if trained else None, "transformers")
                            results[i] = result
            finally:
                if was_training:
                    model.train()
        return results

    def _batches(self, indices: list[int], prompts: list[list[int]], config) -> list[list[int]]:
        """``indices`` cut into the requests of each ``generate`` call (results go back by index, so order is kept)."""
        size = self.max_batch_size or len(indices)
        if self.max_batch_tokens is None:
            return [indices[start : start + size] for start in range(0, len(indices), size)]
        new_tokens = config.max_new_tokens
        if new_tokens is None:
            raise ValueError("A token budget per generate call (rollout_max_batch_tokens) needs max_new_tokens set.")
        rows = getattr(config, "num_beams", None) or 1
        widest = max(len(prompts[i]) for i in indices)
        if len(indices) <= size and rows * len(indices) * (widest + new_tokens) <= self.max_batch_tokens:
            return [indices]  # within the budget: one call in the tick's order, as without a budget
        batches = token_bounded_batches(
            [len(prompts[i]) for i in indices], new_tokens, rows, max_rows=size, max_tokens=self.max_batch_tokens
        )
        alone = [len(prompts[indices[b[0]]]) for b in batches if len(b) == 1]
        alone = [n for n in alone if rows * (n + new_tokens) > self.max_batch_tokens]
        if alone:
            # The same rule as the training forwards' token bound: a call is never cut or dropped, so one longer than
            # the budget runs alone and takes the memory it takes; an error would end a run at the first long
            # conversation (an Eval-Opt history grows with every attempt) although one sequence may well fit.
            logger.warning(
                "%d call(s) need more than rollout_max_batch_tokens=%d on their own (the longest: %d prompt + %d new "
                "tokens%s); each runs as a generate call of its own, above the budget. Raise the budget if memory "
                "allows, or shorten the prompts.",
                len(alone),
                self.max_batch_tokens,
                max(alone),
                new_tokens,
                f", x {rows} beams" if rows > 1 else "",
            )
        return [[indices[j] for j in batch] for batch in batches]

    def config_for(self, generation_kwargs: dict[str, Any]):
        """``generation_config`` with one request's settings applied (``temperature=0``: greedy)."""
        if not generation_kwargs:
            return self.generation_config
        config = copy.deepcopy(self.generation_config)
        updates = {_CONFIG_FIELDS.get(key, key): value for key, value in generation_kwargs.items()}
        if "temperature" in updates:  # a role's own temperature decides between greedy and sampling
            updates["do_sample"] = updates["temperature"] > 0
            if not updates["do_sample"]:
                del updates["temperature"]
        if "stop_strings" in updates:
            updates["stop_strings"] = list(updates["stop_strings"])
        config.update(**updates)
        return config

    @torch.no_grad()
    def _generate_batch(self, model, prompts: list[list[int]], adapters: list[str], config) -> list[GenerationResult]:
        device = next(model.parameters()).device
        input_ids, attention_mask = padded(prompts, self.tokenizer.pad_token_id, side="left")
        input_ids, attention_mask, width = input_ids.to(device), attention_mask.to(device), input_ids.size(1)
        stops = list(getattr(config, "stop_strings", None) or [])
        extra = {"tokenizer": self.tokenizer} if stops else {}  # transformers matches stop strings by its tokens
        beams = getattr(config, "num_beams", None) or 1  # generate runs num_beams rows per prompt, side by side
        scored = None
        if self.report_logprobs:
            if beams > 1:  # beam search reorders its rows between steps: a row's tokens are not one sample's
                raise ValueError("The sampled tokens' log-probs are read per row of `generate`: set num_beams=1.")
            # greedy calls: the logits as they are (vLLM's processed log-probs of a greedy request, too)
            scored = SampledTokenLogprobs((config.temperature or 1.0) if config.do_sample else 1.0)
            extra["logits_processor"] = LogitsProcessorList([scored])
        with self.router.route([adapter for adapter in adapters for _ in range(beams)]):
            output = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=config, **extra
            )
        generated = output[:, width:]
        logprobs = None if scored is None else scored.of(generated).tolist()
        # Each row's length up to its first EOS (0: none), found on the tensor rather than token by token in Python.
        eos = torch.tensor(sorted(self.eos_token_ids), dtype=generated.dtype, device=generated.device)
        at_eos = torch.isin(generated, eos)
        ends = at_eos.any(dim=1) * (at_eos.int().argmax(dim=1) + 1) if generated.size(1) else at_eos.sum(dim=1)
        return self._results(prompts, generated.tolist(), ends.tolist(), stops, logprobs)

    @torch.no_grad()
    def _generate_continuous(self, model, prompts: list[list[int]], adapters: list[str], config):
        """One adapter's prompts through transformers' continuous batching (``generate_batch``): no padding, its own
        paged cache; stop strings are cut afterwards (its scheduler does not match them)."""
        (adapter,) = set(adapters)
        stops = list(getattr(config, "stop_strings", None) or [])
        if stops:
            config = copy.deepcopy(config)
            config.stop_strings = None
        with self.router.route([adapter]):  # its forwards see one flattened row: one adapter for all of them
            outputs = model.generate_batch(
                prompts, generation_config=config, continuous_batching_config=self.continuous_batching
            )
        done = [output for output in outputs.values() if output.error is None]  # in the order of `prompts`
        if len(done) != len(prompts):  # generate_batch logs a failure and returns what finished
            errors = sorted({str(output.error) for output in outputs.values() if output.error is not None})
            said = errors or "none reported: see the log above"
            raise RuntimeError(
                f"Continuous batching finished {len(done)} of {len(prompts)} calls (errors: {said}). Set "
                "use_transformers_continuous_batching=False to generate with `generate`."
            )
        rows = [list(output.generated_tokens) for output in done]
        ends = [next((j + 1 for j, token in enumerate(row) if token in self.eos_token_ids), 0) for row in rows]
        return self._results(prompts, rows, ends, stops)

    def _results(
        self, prompts, rows: list[list[int]], ends: list[int], stops: list[str], logprobs: list | None = None
    ) -> list[GenerationResult]:
        """Each generated row up to its first EOS (``ends``: its length there, 0: none) or the end of a stop string,
        with its tokens' ``logprobs`` (one per generated token) where given."""
        completions, truncated = [], []
        for row, first_eos in zip(rows, ends):
            end = first_eos or None
            stop = self._stop_end(row[:end] if end else row, stops) if stops else None
            end = stop or end
            completions.append(row if end is None else row[:end])
            truncated.append(end is None)
        texts = self.renderer.completion_texts(completions)
        results = [
            GenerationResult(prompt_ids=prompt, completion_ids=completion, text=text, truncated=cut)
            for prompt, completion, text, cut in zip(prompts, completions, texts, truncated)
        ]
        for result, row in zip(results, logprobs or []):
            result.sampling_logprobs = row[: len(result.completion_ids)]
        return results

    def _stop_end(self, row: list[int], stops: list[str]) -> int | None:
        """The length of the shortest prefix of ``row`` whose text contains a stop string, or ``None``.

        A row that stopped on a string is padded after it (with a pad id that may also be an EOS id), so the
        completion is cut where the string was completed; containment only grows with the prefix, so bisect.
        """

        def has_stop(n: int) -> bool:
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True)
            return any(stop in text for stop in stops)

        if not has_stop(len(row)):
            return None
        low, high = 1, len(row)
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if has_stop(middle) else (middle + 1, high)
        return low
