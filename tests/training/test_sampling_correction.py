"""vLLM importance-sampling correction: the reference applies none (its rollout log-probs are only logged), so the
paper preset turns TRL's on-by-default correction off; the toy presets keep it as their figures were measured."""

from __future__ import annotations

import pytest
from presets import CONFIGS, ON_CPU, preset, recipe_args
from scripted import ScriptedBackend
from tiny import half_right_answers, tiny_trainer, train_recording
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig

PAPER = preset("paper_math")


def test_the_paper_preset_turns_the_correction_off_and_the_toy_presets_keep_it():
    paper = recipe_args("--output_dir", "unused", *ON_CPU, recipe="voting_math")
    assert paper.vllm_importance_sampling_correction is False
    library = MultiAgentGRPOConfig(output_dir="unused", use_cpu=True, bf16=False)
    assert library.vllm_importance_sampling_correction is True  # TRL's default, kept as the library default
    for name in ("toy", "toy_code", "toy_two_models"):
        toy = recipe_args("--config", str(CONFIGS / f"{name}.yaml"))
        assert toy.vllm_importance_sampling_correction is True, name


class ReportsSamplingLogprobs(ScriptedBackend):
    """The scripted backend, reporting a sampling log-prob per completion token as vLLM does."""

    def generate(self, requests):
        results = super().generate(requests)
        for result in results:
            result.sampling_logprobs = [-1.0] * len(result.completion_ids)
        return results


@pytest.mark.parametrize("correction", [PAPER["vllm_importance_sampling_correction"], True])
def test_no_importance_sampling_ratio_under_the_paper_preset(tiny_model_dir, tmp_path, correction):
    backend = ReportsSamplingLogprobs(AutoTokenizer.from_pretrained(tiny_model_dir), half_right_answers)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        backend=backend,
        rollout_backend="vllm",
        vllm_importance_sampling_correction=correction,
        update_schedule=PAPER["update_schedule"],
        max_steps=1,
        learning_rate=1e-2,
        save_strategy="no",
        seed=0,
    )
    batches, _ = train_recording(trainer)
    (batch,) = batches
    assert batch.sampling_per_token_logps is not None  # the rollout's log-probs are there either way
    if correction:
        assert batch.importance_sampling_ratio is not None
    else:
        assert batch.importance_sampling_ratio is None
