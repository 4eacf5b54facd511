"""A tiny Qwen3 model and tokenizer built offline, for tests and benchmarks.

Nothing here downloads: the tokenizer is a byte-level BPE trained on a few hundred strings and the model is a
randomly initialised two-layer Qwen3. Both are saved with ``save_pretrained`` so the real ``from_pretrained``
loading path is exercised.
"""

from __future__ import annotations

import os

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _training_corpus() -> list[str]:
    words = (
        "solve the problem answer boxed correct incorrect solution strategy worker evaluator generator aggregator "
        "orchestrator synthesizer compute add subtract multiply divide python def print input return sum number "
        "question final verdict feedback try a different approach select one of the solutions below step"
    ).split()
    lines = [" ".join(words[i : i + 7]) for i in range(len(words))]
    lines += [f"What is {a} + {b}? \\boxed{{{a + b}}}" for a in range(20) for b in range(0, 20, 3)]
    lines += ["--- Solution 1 ---", "STRATEGY 1: add", "```python\nprint(int(input()) + 1)\n```", "\\boxed{Correct}"]
    return lines


def qwen_style_tokenizer(bpe):
    """A trained ``tokenizers.Tokenizer`` as a transformers tokenizer with Qwen's special tokens, left padding and
    ``CHAT_TEMPLATE``."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    return tokenizer


def random_qwen3(tokenizer, seed: int, **sizes):
    """A randomly initialised Qwen3 for ``tokenizer``, seeded: vocabulary rounded up to a multiple of 64, tied
    embeddings, the tokenizer's end and padding ids in the config and the generation config, no BOS. ``sizes`` are
    the other ``Qwen3Config`` fields."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=(len(tokenizer) + 63) // 64 * 64,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **sizes,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_tiny_qwen3(
    output_dir: str, hidden_size: int = 64, num_layers: int = 2, seed: int = 0, vocab_size: int = 512
) -> str:
    """Build, save and return the folder of a tiny Qwen3 causal LM with a chat-template tokenizer (a BPE of
    ``vocab_size`` tokens: another size is another tokenizer, whose ids differ for the same text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(output_dir, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_training_corpus(), trainer=trainer)
    tokenizer = qwen_style_tokenizer(bpe)
    model = random_qwen3(
        tokenizer,
        seed,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        initializer_range=0.5,
    )
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir
