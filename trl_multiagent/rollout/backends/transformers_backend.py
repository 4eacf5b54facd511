"""Rollouts with transformers ``generate``: one left-padded batch per tick, adapters mixed per sample."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from ...adapters.routing import AdapterRouter
from .base import GenerationRequest, GenerationResult


class TransformersBackend:
    """Generates with ``model.generate``; ``unwrapped_model()`` yields the model ready for generation.

    The trainer passes TRL's ``unwrap_model_for_generation`` here, so DeepSpeed ZeRO-3 parameters are gathered
    once per batch rather than once per token.
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
    ):
        self.unwrapped_model = unwrapped_model
        self.tokenizer = tokenizer
        self.router = router
        self.generation_config = generation_config
        self.eos_token_ids = set(eos_token_ids)
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.max_batch_size = max_batch_size

    def tokenize(self, messages) -> list[int]:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **self.chat_template_kwargs
        )

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        prompts = [self.tokenize(request.messages) for request in requests]
        size = self.max_batch_size or len(requests)
        results: list[GenerationResult] = []
        with self.unwrapped_model() as model:
            was_training = model.training
            model.eval()
            try:
                for start in range(0, len(requests), size):
                    chunk = slice(start, start + size)
                    adapters = [request.adapter for request in requests[chunk]]
                    results += self._generate_batch(model, prompts[chunk], adapters)
            finally:
                model.train(was_training)
        return results

    @torch.no_grad()
    def _generate_batch(self, model, prompts: list[list[int]], adapters: list[str]) -> list[GenerationResult]:
        pad_id = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        device = next(model.parameters()).device
        input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with self.router.route(adapters):
            output = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=self.generation_config
            )
        results = []
        for prompt, row in zip(prompts, output[:, width:].tolist()):
            end = next((i + 1 for i, token in enumerate(row) if token in self.eos_token_ids), None)
            completion = row if end is None else row[:end]
            results.append(
                GenerationResult(
                    prompt_ids=prompt,
                    completion_ids=completion,
                    text=self.tokenizer.decode(completion, skip_special_tokens=True),
                    truncated=end is None,
                )
            )
        return results
