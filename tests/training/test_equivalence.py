"""Drop-in equivalence: SingleAgent(template="raw") under shared policy is plain TRL GRPO, step for step."""

from __future__ import annotations

import pytest
import torch
from scripted import addition_dataset, boxed_answer_reward
from tiny import CPU_SETTINGS, tiny_lora, tiny_trainer
from transformers import AutoTokenizer, set_seed
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import SingleAgent

SETTINGS = dict(max_steps=1, logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0)


def scripted_text(prompt_text: str, occurrence: int) -> str:
    number = int(prompt_text.split("What is ")[1].split(" ")[0]) + 2
    return f"\\boxed{{{number if occurrence % 2 == 0 else number + 1}}}"


def texts_for(prompt_texts: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    texts = []
    for text in prompt_texts:
        texts.append(scripted_text(text, seen.get(text, 0)))
        seen[text] = seen.get(text, 0) + 1
    return texts


def adapter_weights(model, adapter: str) -> dict[str, torch.Tensor]:
    return {
        n.replace(f".{adapter}.", "."): p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and f".{adapter}." in n
    }


def text_of(prompt) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


@pytest.mark.parametrize("prompt_format", ["conversational", "standard"])
def test_single_agent_shared_equals_plain_trl(tiny_model_dir, tmp_path, prompt_format):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = addition_dataset()
    if prompt_format == "standard":  # plain-text prompts: no chat template, as TRL tokenizes them
        dataset = dataset.map(lambda row: {"prompt": row["prompt"][-1]["content"]})

    def rollout_func(prompts, trainer):
        prompt_ids = [
            tokenizer(text=p)["input_ids"]
            if isinstance(p, str)
            else tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in prompts
        ]
        texts = texts_for([text_of(p) for p in prompts])
        completion_ids = [
            tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts
        ]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    set_seed(SETTINGS["seed"])  # TRL 1.14 draws its LoRA weights unseeded; 1.15 on seeds with `seed` first, as ours
    plain = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=boxed_answer_reward,
        args=GRPOConfig(output_dir=str(tmp_path / "plain"), **CPU_SETTINGS, **SETTINGS),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=tiny_lora(),
        rollout_func=rollout_func,
    )
    initial = adapter_weights(plain.model, "default")
    plain.train()

    def respond(requests, rng):
        return texts_for([text_of(r.messages) for r in requests])

    ours = tiny_trainer(
        tiny_model_dir,
        tmp_path / "ours",
        SingleAgent(template="raw"),
        dataset=dataset,
        respond=respond,
        policy_sharing="shared",
        **SETTINGS,
    )
    ours_initial = adapter_weights(ours.model, "shared")
    assert all(torch.equal(initial[n], ours_initial[n]) for n in initial)
    ours.train()

    plain_log = next(h for h in plain.state.log_history if "loss" in h)
    ours_log = next(h for h in ours.state.log_history if "loss" in h)
    assert plain_log["reward_std"] > 0  # the step had a learning signal
    assert abs(plain_log["loss"] - ours_log["loss"]) < 1e-5
    plain_after = adapter_weights(plain.model, "default")
    ours_after = adapter_weights(ours.model, "shared")
    moved = max((plain_after[n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 1e-4  # the update is real, so equality below is not vacuous
    assert max((plain_after[n] - ours_after[n]).abs().max().item() for n in plain_after) < 1e-5
