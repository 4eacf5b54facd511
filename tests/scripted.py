"""Test doubles: a backend whose outputs are scripted, and small datasets and rewards."""

from __future__ import annotations

import json
import random

from datasets import Dataset

from trl_multiagent.rollout.backends.base import GenerationRequest, GenerationResult
from trl_multiagent.rollout.chat_rendering import ChatRenderer


class ScriptedBackend:
    """Tokenizes prompts like the real backend and answers with scripted text.

    ``respond(requests, rng) -> list[str]`` picks the outputs of one batch; each text is tokenized and ends with
    EOS.
    """

    def __init__(self, tokenizer, respond, seed: int = 0, chat_template_kwargs=None):
        self.tokenizer = tokenizer
        self.respond = respond
        self.rng = random.Random(seed)
        self.requests: list[GenerationRequest] = []
        self.batch_sizes: list[int] = []
        self.chat_template_kwargs = chat_template_kwargs or {}

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_ids is not None:  # measured by the engine (max_prompt_length)
            return request.prompt_ids
        return ChatRenderer(self.tokenizer).prompt_ids(request.messages, request.tools)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.requests += requests
        self.batch_sizes.append(len(requests))
        results = []
        for request, text in zip(requests, self.respond(requests, self.rng)):
            prompt_ids = self.prompt_ids(request)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            results.append(GenerationResult(prompt_ids=prompt_ids, completion_ids=ids, text=text, truncated=False))
        return results


def tool_call(name: str, **arguments) -> str:
    """A completion calling tool ``name`` in Qwen3's tool-call format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def addition_dataset(n: int = 8) -> Dataset:
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} + 2?"}], "answer": str(i + 2)} for i in range(n)]
    )


def boxed_answer_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the final answer contains the expected number."""
    return [float(str(a) in (c[0]["content"] if isinstance(c, list) else c)) for c, a in zip(completions, answer)]


class AsyncScriptedBackend(ScriptedBackend):
    """``ScriptedBackend`` answering one request at a time (``agenerate``), each after ``delay(request)`` seconds,
    the way a continuously batching server does: results come back in any order. ``started`` and ``finished`` count
    requests; ``cancelled`` lists the requests cancelled while they waited."""

    def __init__(self, tokenizer, respond, delay, seed: int = 0):
        super().__init__(tokenizer, respond, seed)
        self.delay = delay
        self.started = self.finished = 0
        self.cancelled: list[GenerationRequest] = []
        self.running = 0
        self.most_running = 0

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        import asyncio

        self.started += 1
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay(request))
        except asyncio.CancelledError:
            self.cancelled.append(request)
            raise
        finally:
            self.running -= 1
        (result,) = self.generate([request])
        self.finished += 1
        return result

    def drain(self) -> None:
        assert self.running == 0, f"{self.running} requests still running after the rollout"
