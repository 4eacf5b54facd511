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


# Token counts of the paper preset's Eval-Opt prompts (math, the "paper" prompt set, `chat_rendering:
# reference_qwen`), estimated at 4 characters a token: Qwen's default system turn, a turn's markup (<|im_start|>,
# role, newlines, <|im_end|>), the empty think block every assistant turn and the generation prompt carry, and the
# three requests (solve without its problem, evaluate, refine).
_SYSTEM_TURN, _TURN, _EMPTY_THINK, _SOLVE, _EVALUATE, _REFINE = 22, 5, 4, 28, 65, 48


def eval_opt_call_lengths(
    episodes: int,
    *,
    seed: int = 0,
    max_iterations: int = 3,
    p_correct: float = 0.4,
    generator_median: float = 1500.0,
    evaluator_median: float = 175.0,
    sigma: float = 1.0,
    cap: int = 5120,
    problem_median: float = 100.0,
) -> list[list[tuple[str, int, int]]]:
    """Per episode, each call's ``(role, prompt tokens, completion tokens)`` of Eval-Opt at the paper preset's
    lengths, drawn seeded: the shared conversation (``history="shared"``, the paper's), so every evaluator prompt
    holds every earlier attempt and critique and every refinement prompt too; up to ``max_iterations`` rounds, each
    ending the episode with probability ``p_correct`` (the verdict said Correct). Completions are log-normal per role
    (``generator_median``, ``evaluator_median``, shape ``sigma``) capped at ``cap`` (``max_completion_length``): the
    paper-scale distribution benchmarks/rollout_async.py simulates (the evaluator's median 131 words, ~175 tokens,
    as reported). Problems are log-normal around ``problem_median`` tokens (DAPO-Math's run 270-420 characters)."""
    import random

    rng = random.Random(seed)

    def drawn(median: float) -> int:
        return max(1, min(cap, round(rng.lognormvariate(0.0, sigma) * median)))

    plans = []
    for _ in range(episodes):
        problem = max(1, round(rng.lognormvariate(0.0, 0.4) * problem_median))
        history = _SYSTEM_TURN + _TURN + _SOLVE + problem  # the conversation every call of the episode sees
        generation_prompt = _TURN + _EMPTY_THINK
        calls = []
        for iteration in range(max_iterations):
            if iteration:  # a refinement: the history so far and the refine request
                calls.append(("generator", history + _TURN + _REFINE + generation_prompt, drawn(generator_median)))
            else:
                calls.append(("generator", history + generation_prompt, drawn(generator_median)))
            history += _TURN + _EMPTY_THINK + calls[-1][2]
            calls.append(("evaluator", history + _TURN + _EVALUATE + generation_prompt, drawn(evaluator_median)))
            history += _TURN + _EMPTY_THINK + calls[-1][2]
            if rng.random() < p_correct:
                break
        plans.append(calls)
    return plans


def batch_of_lengths(plans: list[list[tuple[str, int, int]]], *, shared: bool):
    """A `TrainingBatch` of ``plans`` (``eval_opt_call_lengths``'s: per episode, each call's role and lengths) in
    episode order, padded as `calls_to_batch` pads it (left-padded prompts, right-padded completions) with every id
    0 and boolean masks, to count forwards and tokens at paper scale cheaply. Isolated policy (``shared=False``): an
    adapter per role; shared: one adapter, ``"shared"``."""
    import torch

    from .training.batch import TrainingBatch

    calls = [(episode, role, p, c) for episode, plan in enumerate(plans) for role, p, c in plan]
    width_p, width_c = max(p for _, _, p, _ in calls), max(c for _, _, _, c in calls)
    prompt_mask = torch.zeros((len(calls), width_p), dtype=torch.bool)
    completion_mask = torch.zeros((len(calls), width_c), dtype=torch.bool)
    for row, (_, _, p, c) in enumerate(calls):
        prompt_mask[row, width_p - p :] = True
        completion_mask[row, :c] = True
    n = len(calls)
    return TrainingBatch(
        prompt_ids=torch.zeros((n, width_p), dtype=torch.int32),
        prompt_mask=prompt_mask,
        completion_ids=torch.zeros((n, width_c), dtype=torch.int32),
        completion_mask=completion_mask,
        advantages=torch.ones(n),
        roles=[role for _, role, _, _ in calls],
        adapters=["shared" if shared else role for _, role, _, _ in calls],
        instances=torch.zeros(n, dtype=torch.long),
        episode_ids=torch.tensor([episode for episode, _, _, _ in calls]),
        truncated=torch.zeros(n, dtype=torch.bool),
        sample_weights=torch.ones(n),
        num_items_in_batch=completion_mask.sum().float(),
        num_samples_in_batch=torch.tensor(float(n)),
    )
