"""Chat rendering (`chat_rendering`): the reference's Qwen rendering under the paper preset, the tokenizer's own chat
template by default, the same in every backend and in evaluation.

The expected prompt below is written out by hand from the reference's parser (rLLM `QwenChatTemplateParser` with
`disable_thinking=True`, as `multi_agent_ppo_trainer.yaml` sets it, called with `is_first_msg=True` and
`accumulate_reasoning=False` on every call, the text tokenized with `add_special_tokens=False`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import types

import pytest
from presets import CONFIGS, ON_CPU, evaluation_settings, recipe_args
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from trl_multiagent import MultiAgentGRPOConfig, SingleAgent
from trl_multiagent.checkpoints import load_base_workflow
from trl_multiagent.evaluation import eos_token_ids, make_generation_config, run_episodes
from trl_multiagent.evaluation.evaluator import EvalSettings
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend
from trl_multiagent.rollout.chat_rendering import ChatRenderer

# Eval-Opt's second evaluator call as the reference makes it: the problem, then only assistant outputs (attempt 1,
# critique 1, attempt 2), then the evaluate request. Surrounding spaces on purpose: assistant turns are stripped,
# user turns are not.
SECOND_EVALUATOR_CALL = [
    {"role": "user", "content": "Solve: What is 3 + 4?"},
    {"role": "assistant", "content": "3 + 4 = 7, so \\boxed{7}\n"},
    {"role": "assistant", "content": "  The sum is right.\n\\boxed{Correct}"},
    {"role": "assistant", "content": "Again: 3 + 4 = 7. \\boxed{7}"},
    {"role": "user", "content": "Evaluate the latest solution.\n"},
]
REFERENCE_PROMPT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nSolve: What is 3 + 4?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n3 + 4 = 7, so \\boxed{7}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\nThe sum is right.\n\\boxed{Correct}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\nAgain: 3 + 4 = 7. \\boxed{7}<|im_end|>\n"
    "<|im_start|>user\nEvaluate the latest solution.\n<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]


def one_question_prompt(question: str) -> str:
    return (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


QUESTION_PROMPT = one_question_prompt("What is 1 + 2?")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def reference_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_reference_qwen_renders_evalopts_second_evaluator_call_as_the_reference(tokenizer):
    renderer = ChatRenderer(tokenizer, "reference_qwen", {"enable_thinking": False})
    assert renderer.text(SECOND_EVALUATOR_CALL) == REFERENCE_PROMPT
    ids = renderer.prompt_ids(SECOND_EVALUATOR_CALL)
    assert ids == reference_ids(tokenizer, REFERENCE_PROMPT)
    # Qwen's markup is one token each (7 turns), and the think blocks are ordinary text that decodes back unchanged
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 7
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_end|>")) == 6
    assert tokenizer.decode(ids) == REFERENCE_PROMPT
    assert tokenizer.decode(reference_ids(tokenizer, "<think>\n\n</think>\n\n")) == "<think>\n\n</think>\n\n"


def test_reference_qwen_keeps_a_leading_system_message_and_leaves_reasoning_out(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 2?"},
        {"role": "assistant", "content": " \\boxed{3} ", "reasoning": "1 + 2 is 3"},
        {"role": "user", "content": "Check it."},
    ]
    assert ChatRenderer(tokenizer, "reference_qwen").text(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n\\boxed{3}<|im_end|>\n"
        "<|im_start|>user\nCheck it.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_tokenizer_rendering_is_the_chat_template_unchanged(tokenizer):
    renderer = ChatRenderer(tokenizer)
    template = tokenizer.apply_chat_template(
        SECOND_EVALUATOR_CALL, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert renderer.prompt_ids(SECOND_EVALUATOR_CALL) == template
    assert renderer.text(SECOND_EVALUATOR_CALL) == tokenizer.apply_chat_template(
        SECOND_EVALUATOR_CALL, add_generation_prompt=True, tokenize=False
    )
    assert "You are Qwen" not in renderer.text(SECOND_EVALUATOR_CALL) and "<think>" not in tokenizer.decode(template)
    assert renderer.prompt_ids("plain text") == tokenizer(text="plain text")["input_ids"]  # TRL's standard format
    assert ChatRenderer(tokenizer, "reference_qwen").prompt_ids("plain text") == renderer.prompt_ids("plain text")


def test_the_paper_presets_render_as_the_reference_and_the_toy_presets_as_the_tokenizer(tmp_path):
    assert recipe_args("--output_dir", str(tmp_path), *ON_CPU).chat_rendering == "reference_qwen"
    assert evaluation_settings("--device", "cpu").chat_rendering == "reference_qwen"
    for name in ("toy", "toy_code", "toy_two_models"):
        assert recipe_args("--config", str(CONFIGS / f"{name}.yaml")).chat_rendering == "tokenizer", name
    assert MultiAgentGRPOConfig.__dataclass_fields__["chat_rendering"].default == "tokenizer"
    assert EvalSettings.__dataclass_fields__["chat_rendering"].default == "tokenizer"


def test_bad_rendering_settings_fail_with_the_fix(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="must be one of \\('tokenizer', 'reference_qwen'\\)"):
        MultiAgentGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, chat_rendering="qwen")
    with pytest.raises(ValueError, match="always with thinking off.*enable_thinking': True"):
        MultiAgentGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            chat_rendering="reference_qwen",
            chat_template_kwargs={"enable_thinking": True},
        )
    with pytest.raises(ValueError, match="would be ignored"):
        EvalSettings(chat_rendering="reference_qwen", chat_template_kwargs='{"custom": 1}', device="cpu")
    with pytest.raises(ValueError, match="renders system, user and assistant messages, got role 'tool'"):
        ChatRenderer(tokenizer, "reference_qwen").text([*QUESTION, {"role": "tool", "content": "42"}])

    word_level = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    not_qwen = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="[UNK]", pad_token="[UNK]")
    with pytest.raises(
        ValueError, match="has no token <\\|im_start\\|> or <\\|im_end\\|>.*chat_rendering='tokenizer'"
    ):
        TransformersBackend(
            contextlib.nullcontext,
            not_qwen,
            router=None,
            generation_config=None,
            eos_token_ids=[0],
            chat_rendering="reference_qwen",
        )


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return load_base_workflow(tiny_model_dir, SingleAgent())


def reference_backend(base, max_new_tokens: int) -> TransformersBackend:
    """The transformers backend over the tiny base model, rendering as the reference does."""
    return TransformersBackend(
        lambda: contextlib.nullcontext(base.model),
        base.tokenizer,
        base.router,
        make_generation_config(base, max_new_tokens=max_new_tokens),
        eos_token_ids(base),
        {"enable_thinking": False},
        chat_rendering="reference_qwen",
    )


def test_transformers_backend_generates_from_the_reference_prompt(base):
    seen = []
    original = base.model.generate

    def generate(*args, **kwargs):
        seen.append(kwargs["input_ids"])
        return original(*args, **kwargs)

    backend = reference_backend(base, max_new_tokens=2)
    base.model.generate = generate
    try:
        long, short = backend.generate(
            [GenerationRequest("__base__", SECOND_EVALUATOR_CALL), GenerationRequest("__base__", QUESTION)]
        )
    finally:
        del base.model.generate
    expected = reference_ids(base.tokenizer, REFERENCE_PROMPT)
    assert long.prompt_ids == expected and short.prompt_ids == reference_ids(base.tokenizer, QUESTION_PROMPT)
    (input_ids,) = seen  # one left-padded batch: the longer prompt fills its row
    assert input_ids[0].tolist() == expected
    assert input_ids[1, -len(short.prompt_ids) :].tolist() == short.prompt_ids


def reference_content(decoded: str) -> str:
    """The reference parser's completion content with thinking off (rllm/parser/chat_template_parser.py:509-537):
    after the one ``</think>`` if there is exactly one, else the whole text; EOS removed; stripped."""
    if decoded.count("</think>") == 1:
        return decoded.partition("</think>")[2].strip()
    return decoded.strip()


@pytest.mark.parametrize(
    "completion",
    [
        "\n\n3 + 4 = 7, so \\boxed{7}  \n",
        "<think>\nadd them\n</think>\n\n\\boxed{7}\n",
        "a</think>b</think> c ",
        "plain answer",
        "",
    ],
)
def test_completions_reach_the_workflow_as_the_references_content(tokenizer, completion):
    ids = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert ChatRenderer(tokenizer, "reference_qwen").completion_text(ids) == reference_content(decoded)
    assert ChatRenderer(tokenizer).completion_text(ids) == decoded  # the library default: the text as decoded


@pytest.mark.parametrize("rendering", ["tokenizer", "reference_qwen"])
def test_completions_decoded_together_read_as_one_at_a_time(tokenizer, rendering):
    texts = ["\n\n3 + 4 = 7, so \\boxed{7}  \n", "<think>\nadd them\n</think>\n\n\\boxed{7}\n", "", "plain answer"]
    completions = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in texts]
    completions.append([])  # a call that generated nothing
    renderer = ChatRenderer(tokenizer, rendering)
    assert renderer.completion_texts(completions) == [renderer.completion_text(ids) for ids in completions]
    assert renderer.completion_texts([]) == []


def test_the_backend_hands_the_workflow_the_references_content(base):
    backend = reference_backend(base, max_new_tokens=12)
    (result,) = backend.generate([GenerationRequest("__base__", QUESTION)])
    decoded = base.tokenizer.decode(result.completion_ids, skip_special_tokens=True)
    assert result.text == reference_content(decoded)


def test_evaluation_episodes_render_as_asked(base):
    config = make_generation_config(base, max_new_tokens=2)
    (reference,) = run_episodes(base, [QUESTION], config, chat_rendering="reference_qwen")
    (default,) = run_episodes(base, [QUESTION], config)
    (message,) = reference.calls[0].messages  # the workflow's one request, the same in both
    assert message["role"] == "user" and default.calls[0].messages == [message]
    assert reference.calls[0].prompt_ids == reference_ids(base.tokenizer, one_question_prompt(message["content"]))
    assert default.calls[0].prompt_ids == ChatRenderer(base.tokenizer).prompt_ids(default.calls[0].messages)
    assert default.calls[0].prompt_ids != reference.calls[0].prompt_ids


def test_trainer_builds_its_backend_with_the_configs_rendering(tiny_model_dir, tmp_path):
    from tiny import tiny_trainer

    trainer = tiny_trainer(tiny_model_dir, tmp_path, chat_rendering="reference_qwen")
    assert trainer.rollout_backend.renderer.chat_rendering == "reference_qwen"
    assert trainer.rollout_backend.tokenize(QUESTION) == reference_ids(trainer._text_tokenizer, QUESTION_PROMPT)


def test_chat_template_kwargs_reach_the_prompts_the_trainer_trains_on(tool_model_dir, tmp_path):
    """Qwen3's chat template (the tool model's) opens an empty thinking block when `enable_thinking` is false."""
    from scripted import addition_dataset
    from tiny import tiny_trainer

    def first_prompt(**settings) -> str:
        folder = tmp_path / str(bool(settings))
        trainer = tiny_trainer(tool_model_dir, folder, SingleAgent(), max_completion_length=2, **settings)
        batch = trainer._generate_and_score([row for row in addition_dataset(1) for _ in range(4)])
        return trainer._text_tokenizer.decode(batch.prompt_ids[0][batch.prompt_mask[0].bool()])

    thinking, not_thinking = first_prompt(), first_prompt(chat_template_kwargs={"enable_thinking": False})
    assert thinking.endswith("<|im_start|>assistant\n")
    assert not_thinking == thinking + "<think>\n\n</think>\n\n"


@pytest.fixture
def fake_vllm(monkeypatch):
    """Just the names the colocated vLLM backends import from vLLM; `LLM.generate` and `AsyncLLM.generate` record the
    token prompts they are given."""
    sent = []
    sample = types.SimpleNamespace(
        token_ids=[0], logprobs=[{0: types.SimpleNamespace(logprob=-0.5)}], finish_reason="stop"
    )

    class LLM:
        def __init__(self, **engine_args):
            pass

        def generate(self, prompts, params, lora_request, use_tqdm):
            sent.extend(prompt["prompt_token_ids"] for prompt in prompts)
            return [types.SimpleNamespace(outputs=[sample]) for _ in prompts]

    class AsyncLLM:
        output_handler = None

        @classmethod
        def from_engine_args(cls, args):
            return cls()

        async def generate(self, prompt, params, request_id, lora_request):
            sent.append(prompt["prompt_token_ids"])
            yield types.SimpleNamespace(outputs=[sample])

        def shutdown(self):
            pass

    names = ("vllm", "vllm.inputs", "vllm.lora", "vllm.lora.request", "vllm.engine", "vllm.engine.arg_utils")
    names += ("vllm.v1", "vllm.v1.engine", "vllm.v1.engine.async_llm")
    modules = {name: types.ModuleType(name) for name in names}
    modules["vllm"].LLM, modules["vllm"].SamplingParams = LLM, dict
    modules["vllm.inputs"].TokensPrompt = dict
    modules["vllm.lora.request"].LoRARequest = lambda *args, **kwargs: args
    modules["vllm.engine.arg_utils"].AsyncEngineArgs = dict
    modules["vllm.v1.engine.async_llm"].AsyncLLM = AsyncLLM
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return sent


@pytest.mark.parametrize("engine", ["VLLMBackend", "AsyncVLLMBackend"])
def test_colocated_vllm_backends_send_the_reference_prompt(engine, fake_vllm, tokenizer, tmp_path):
    from trl_multiagent.rollout.backends import vllm_backend

    backend = getattr(vllm_backend, engine)(
        "tiny",
        tokenizer,
        ["generator"],
        lora_rank=4,
        sampling={"max_tokens": 2},
        eos_token_ids=[0],
        chat_template_kwargs={"enable_thinking": False},
        adapter_dir=str(tmp_path),
        chat_rendering="reference_qwen",
    )
    backend.folders.paths["generator"] = "/adapters/generator"  # what sync_adapters records
    backend.folders.loaded("generator")
    request = GenerationRequest("generator", SECOND_EVALUATOR_CALL)
    results = backend.generate([request])
    if engine == "AsyncVLLMBackend":  # one call at a time as well (rollout_mode="async")
        results.append(asyncio.run(backend.agenerate(request)))
        backend.close()
    expected = reference_ids(tokenizer, REFERENCE_PROMPT)
    assert fake_vllm == [expected] * len(results) and [r.prompt_ids for r in results] == fake_vllm


def multiply(a: int, b: int) -> int:
    """Multiply two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


class CountingTokenizer:
    """The tokenizer, counting the conversations its chat template renders."""

    def __init__(self, tokenizer):
        self.tokenizer, self.rendered = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def apply_chat_template(self, conversation, **kwargs):
        self.rendered += len(conversation) if isinstance(conversation[0], list) else 1
        return self.tokenizer.apply_chat_template(conversation, **kwargs)


@pytest.mark.parametrize("rendering", ["tokenizer", "reference_qwen"])
def test_a_batch_of_prompts_renders_each_distinct_one_once_with_the_ids_of_one_at_a_time(tool_model_dir, rendering):
    from transformers.utils import get_json_schema

    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)  # Qwen3's template, which renders tools
    tools = [get_json_schema(multiply)]
    voter = [{"role": "user", "content": "What is 2 + 2?"}]
    prompts = [
        (voter, None),
        ([dict(message) for message in voter], None),  # an equal prompt, built apart (a parallel call)
        (SECOND_EVALUATOR_CALL, None),
        ("plain text", None),
        (voter, tools if rendering == "tokenizer" else None),
        (QUESTION, None),
        (voter, None),
    ]
    counting = CountingTokenizer(tokenizer)
    renderer = ChatRenderer(counting, rendering)
    batch = renderer.prompt_ids_of(prompts)
    assert batch == [ChatRenderer(tokenizer, rendering).prompt_ids(messages, tools) for messages, tools in prompts]
    if rendering == "tokenizer":
        assert batch[4] != batch[0]  # the tools are in the prompt
        assert counting.rendered == 4  # voter, the evaluator call, voter with tools, the question
    batch[0].append(-1)  # every prompt has a list of its own
    assert batch[1][-1] != -1 and batch[6][-1] != -1
