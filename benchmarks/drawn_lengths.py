"""A rollout backend that answers each call with random words of a length drawn per role: paper-length training
samples in seconds, where generating them with a random model would take most of an hour.

With a word-level tokenizer (one id per word, `word_tokenizer`), decoding and re-encoding keeps every completion's
token count, so the prompts that quote earlier outputs (the evaluator's, the refining generator's) grow as in a real
run. A random "verdict" never reads as `\\boxed{Correct}`, so every Eval-Opt episode runs all its iterations.
"""

from __future__ import annotations

import random

from tokenizers import Tokenizer, models, pre_tokenizers

from trl_multiagent.rollout.backends.base import GenerationResult
from trl_multiagent.testing import qwen_style_tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def word_tokenizer(vocab_size: int):
    """Every id is a word (`w123`), so decoding then re-encoding generated ids keeps their count."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = qwen_style_tokenizer(words)
    tokenizer.unk_token = "<unk>"
    return tokenizer


class DrawnLengths:
    """``generate`` answers each request with ``randint(*lengths[adapter])`` random word ids (no EOS: a completion
    that stops at the length cap, as a random model's do)."""

    def __init__(self, tokenizer, lengths: dict[str, tuple[int, int]], seed: int = 0):
        self.tokenizer = tokenizer
        self.lengths = lengths
        self.rng = random.Random(seed)
        self.words = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)]

    def generate(self, requests):
        results = []
        for request in requests:
            prompt = request.prompt_ids
            if prompt is None:
                prompt = self.tokenizer.apply_chat_template(
                    request.messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            low, high = self.lengths[request.adapter]
            completion = [self.rng.choice(self.words) for _ in range(self.rng.randint(low, high))]
            text = self.tokenizer.decode(completion, skip_special_tokens=True)
            results.append(GenerationResult(list(prompt), completion, text, truncated=False))
        return results
