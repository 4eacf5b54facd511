"""Every field TRL's GRPOConfig adds to TrainingArguments is honoured (its effect on the trainer shown here, or in the
test trl_multiagent/config/grpo_config_fields.py names), refused at construction saying what to set instead, or said
not to apply; the installed TRL has no field the table leaves out."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import types
from pathlib import Path

import pytest
import torch
import transformers
import trl
from packaging.version import Version
from peft import LoraConfig
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from settings_in_tests import settings_a_test_sets
from tiny import half_right_answers, tiny_config, tiny_lora, tiny_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, SingleAgent, Voting
from trl_multiagent.config.grpo_config_fields import GRPO_CONFIG_FIELDS, HONOURED, NOT_APPLICABLE, REFUSED
from trl_multiagent.config.multiagent_grpo_config import SettingsWarning
from trl_multiagent.rollout.backends.base import GenerationRequest
from trl_multiagent.seams.trl import batch_importance_sampling_ratio
from trl_multiagent.training.loss_weights import loss_ready

TRL_BELOW_1_15 = Version(trl.__version__) < Version("1.15.0")

ROOT = Path(__file__).resolve().parents[2]
ONE_STEP = dict(max_steps=1, logging_steps=1, save_strategy="no", seed=0)
TRL_FIELDS = [
    f.name for f in dataclasses.fields(trl.GRPOConfig) if f.name not in TrainingArguments.__dataclass_fields__
]


# ------------------------------------------------------------------------------------------------- the table itself
def test_every_field_trl_adds_is_accounted_for_once():
    missing = sorted(set(TRL_FIELDS) - set(GRPO_CONFIG_FIELDS))
    assert missing == [], (
        f"TRL {trl.__version__} adds {missing}: say what the trainer does with each in grpo_config_fields.py"
    )
    assert sorted(set(GRPO_CONFIG_FIELDS) - set(TRL_FIELDS)) == [], "grpo_config_fields.py names fields TRL lacks"


def test_each_entry_says_why_and_each_honoured_field_names_a_test_that_sets_it():
    wrong = []
    for name, use in GRPO_CONFIG_FIELDS.items():
        assert use.status in (HONOURED, REFUSED, NOT_APPLICABLE) and use.why, name
        assert bool(use.instead) == (use.status == REFUSED), f"{name}: a refusal, and only one, says what instead"
        if use.status != HONOURED:
            continue
        path, test = use.test.split("::")
        try:
            if name not in settings_a_test_sets(ROOT / path, test):
                wrong.append(f"{name}: {use.test} never sets `{name}`, so it cannot show its effect")
        except KeyError:
            wrong.append(f"{name}: {use.test} does not exist")
    assert wrong == []


EXAMPLE_TEST = '''
SETTINGS = dict(top_k=5)


@pytest.mark.parametrize("switch", ["use_transformers_paged"])
def test_example(switch):
    """Says beta and --epsilon in its docstring."""
    # sets temperature, in a comment only
    args = tiny_config(top_p=0.9, **{"min_p": 0.1, switch: True}, **SETTINGS)
    args.num_iterations = 2
    monkeypatch.setattr(args, "delta", 1.5)
    run(["--loss_type", "dapo", "--scale_rewards=none"])
    print(args.steps_per_generation, "max_completion_length")
'''


def test_the_accounting_reads_what_a_test_sets_not_what_it_mentions(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text(EXAMPLE_TEST)
    sets = settings_a_test_sets(source, "test_example")
    assert {"top_k", "use_transformers_paged", "top_p", "min_p", "num_iterations", "delta", "loss_type"} <= sets
    assert "scale_rewards" in sets
    assert not {"beta", "epsilon", "temperature", "steps_per_generation", "max_completion_length"} & sets
    with pytest.raises(KeyError):
        settings_a_test_sets(source, "test_missing")


# A value of each refused or inapplicable field that would change something
REFUSED_VALUES = {
    "vllm_enable_sleep_mode": True,
    "vllm_structured_outputs_regex": r"\d+",
    "vllm_tensor_parallel_size": 2,
    "sync_ref_model": True,
}
INAPPLICABLE_VALUES = {
    "vllm_group_port": 51217,
    "ref_model_mixup_alpha": 0.9,
    "ref_model_sync_steps": 64,
    "log_multimodal": False,
}


def test_every_refused_or_inapplicable_field_is_tried_below():
    for values, status in ((REFUSED_VALUES, REFUSED), (INAPPLICABLE_VALUES, NOT_APPLICABLE)):
        assert sorted(values) == sorted(n for n, use in GRPO_CONFIG_FIELDS.items() if use.status == status)


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_a_refused_field_set_fails_at_construction_saying_what_to_set_instead(name, tmp_path):
    use = GRPO_CONFIG_FIELDS[name]
    with pytest.raises(ValueError, match=rf"`{name}=.*Instead: ") as raised:
        tiny_config(tmp_path, **{name: REFUSED_VALUES[name]})
    assert use.instead in str(raised.value)


@pytest.mark.parametrize("name", sorted(INAPPLICABLE_VALUES))
def test_an_inapplicable_field_set_is_said_to_have_no_effect(name, tmp_path):
    with pytest.warns(SettingsWarning, match=rf"`{name}=.*` has no effect here") as caught:
        MultiAgentGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{name: INAPPLICABLE_VALUES[name]})
    assert caught[0].filename == __file__  # pointing at the line that built the config


def test_trls_defaults_raise_and_warn_nothing(tmp_path, recwarn):
    tiny_config(tmp_path)
    assert not [w for w in recwarn if issubclass(w.category, SettingsWarning)]


def test_an_unknown_loss_type_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"`loss_type` must be one of \['grpo'.*got 'ppo'"):
        tiny_config(tmp_path, loss_type="ppo")


# ------------------------------------------------------------------------------------------------- model loading
def custom_code_copy(model_dir: str, folder: Path) -> str:
    """``model_dir`` with an `auto_map` to a model class of its own code (a subclass of its architecture)."""
    import json

    shutil.copytree(model_dir, folder)
    (folder / "custom_model.py").write_text(
        "from transformers import Qwen3ForCausalLM\n\n\nclass CustomQwen3(Qwen3ForCausalLM):\n    pass\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "custom_model.CustomQwen3"}
    config["architectures"] = ["CustomQwen3"]  # not a transformers class: loaded through `auto_map`
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("trust", [False, True])
def test_model_init_kwargs_and_trust_remote_code_load_every_base(tiny_model_dir, tmp_path, trust):
    custom = custom_code_copy(tiny_model_dir, tmp_path / "custom")
    other = custom_code_copy(tiny_model_dir, tmp_path / "other")
    trainer = MultiAgentGRPOTrainer(
        model=custom,
        workflow=Voting(),
        reward_funcs=boxed_answer_reward,
        args=tiny_config(
            tmp_path / "run",
            policy_sharing="isolated",
            role_models={"aggregator": other},
            model_init_kwargs={"dtype": "bfloat16"},
            trust_remote_code=trust,
        ),
        train_dataset=addition_dataset(),
        peft_config=tiny_lora(),
    )
    (extra,) = trainer.bases.extra.values()
    for model in (trainer.model.get_base_model(), extra.model.get_base_model()):
        assert type(model).__name__ == ("CustomQwen3" if trust else "Qwen3ForCausalLM")
        assert model.dtype == torch.bfloat16


def test_disable_dropout_reaches_every_role_adapter(tiny_model_dir, tmp_path):
    def dropouts(disable: bool) -> set[float]:
        trainer = MultiAgentGRPOTrainer(
            model=tiny_model_dir,
            workflow=Voting(),
            reward_funcs=boxed_answer_reward,
            args=tiny_config(tmp_path / str(disable), policy_sharing="isolated", disable_dropout=disable),
            train_dataset=addition_dataset(),
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.3),
        )
        names = [n for n, m in trainer.model.named_modules() if isinstance(m, torch.nn.Dropout)]
        assert any(".generator" in n for n in names) and any(".aggregator" in n for n in names)
        return {m.p for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout)}

    assert dropouts(disable=False) == {0.3}
    assert dropouts(disable=True) == {0.0}


def test_cast_lm_head_to_fp32_casts_the_trainers_head(tiny_model_dir, tmp_path):
    # An LM head of its own: TRL 1.16 fails to cast a PEFT model's head tied to its embeddings (it looks for
    # `embed_tokens` on the PeftModel's inner model), before anything of this package runs.
    untied = str(tmp_path / "untied")
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False).save_pretrained(untied)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(untied)

    def head(cast: bool) -> torch.Tensor:
        trainer = tiny_trainer(
            untied,
            tmp_path / str(cast),
            SingleAgent(),
            respond=half_right_answers,
            model_init_kwargs={"dtype": "bfloat16"},
            cast_lm_head_to_fp32=cast,
        )
        return trainer.model.get_base_model().lm_head

    assert head(cast=False).weight.dtype == torch.bfloat16
    cast = head(cast=True)
    assert cast.weight.dtype == torch.float32
    assert cast(torch.ones(1, cast.in_features, dtype=torch.bfloat16)).dtype == torch.float32


def test_cast_lm_head_to_fp32_on_a_tied_head_is_refused_before_trl_fails_on_it(tiny_model_dir, tmp_path):
    """The tiny model ties its head to its embeddings, as Qwen3-0.6B/1.7B/4B do: TRL's own cast of a PEFT model stops
    with an AttributeError, so the trainer refuses first, naming the fix, also in `--validate`'s checks."""
    from peft import get_peft_model

    from trl_multiagent.config.run_checks import check_run

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    with pytest.raises(AttributeError, match="embed_tokens"):  # what a user would meet without the refusal
        trl.GRPOTrainer(
            model=get_peft_model(model, tiny_lora()),
            reward_funcs=boxed_answer_reward,
            args=trl.GRPOConfig(str(tmp_path / "trl"), cast_lm_head_to_fp32=True, use_cpu=True, report_to=[]),
            train_dataset=addition_dataset(),
        )
    refusal = "cast_lm_head_to_fp32.*tied to its embeddings.*Set `cast_lm_head_to_fp32=False`"
    with pytest.raises(ValueError, match=refusal):
        tiny_trainer(tiny_model_dir, tmp_path / "ours", SingleAgent(), cast_lm_head_to_fp32=True)
    args = tiny_config(tmp_path / "checks", cast_lm_head_to_fp32=True)
    with pytest.raises(ValueError, match=refusal):
        check_run(args, SingleAgent(), model=tiny_model_dir, peft_config=tiny_lora(), train_dataset=addition_dataset())
    untied = tiny_config(
        tmp_path / "untied", cast_lm_head_to_fp32=True, model_init_kwargs={"tie_word_embeddings": False}
    )
    check_run(untied, SingleAgent(), model=tiny_model_dir, peft_config=tiny_lora(), train_dataset=addition_dataset())


def test_router_aux_loss_coef_weighs_the_moe_auxiliary_loss(tiny_moe_dir, tmp_path):
    def first_step(coef: float) -> dict:
        trainer = tiny_trainer(
            tiny_moe_dir,
            tmp_path / str(coef),
            SingleAgent(),
            respond=half_right_answers,
            router_aux_loss_coef=coef,
            **ONE_STEP,
        )
        trainer.train()
        return next(h for h in trainer.state.log_history if "loss" in h)

    off, on = first_step(0.0), first_step(10.0)
    assert "aux_loss" not in off and on["aux_loss"] > 0
    assert on["loss"] == pytest.approx(off["loss"] + 10.0 * on["aux_loss"], rel=1e-3, abs=1e-4)


# --------------------------------------------------------------------------------------------------------- batches
def recorded_rows(trainer) -> list[list[dict]]:
    """The rows of every rollout the trainer's engine runs."""
    runs, run = [], trainer.engine.run

    def recorded(prompts, *args, **kwargs):
        runs.append(list(prompts))
        return run(prompts, *args, **kwargs)

    trainer.engine.run = recorded
    return runs


def problem(prompt) -> str:
    return prompt[-1]["content"] if isinstance(prompt, list) else prompt


def test_episodes_per_prompt_are_num_generations(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        respond=half_right_answers,
        num_generations=3,
        per_device_train_batch_size=6,
        **ONE_STEP,
    )
    runs = recorded_rows(trainer)
    trainer.train()
    (rows,) = runs
    problems = [problem(p) for p in rows]
    assert len(problems) == 6 and all(problems.count(p) == 3 for p in problems)


def test_shuffle_dataset_false_keeps_dataset_order(tiny_model_dir, tmp_path):
    def first_problems(shuffle: bool) -> list[str]:
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / str(shuffle),
            SingleAgent(),
            respond=half_right_answers,
            dataset=addition_dataset(16),
            shuffle_dataset=shuffle,
            **{**ONE_STEP, "max_steps": 3},
        )
        runs = recorded_rows(trainer)
        trainer.train()
        return list(dict.fromkeys(problem(p) for rows in runs for p in rows))

    in_order = [f"What is {i} + 2?" for i in range(3)]
    assert first_problems(shuffle=False) == in_order
    assert first_problems(shuffle=True) != in_order


@pytest.mark.parametrize("size", [dict(generation_batch_size=12), dict(steps_per_generation=3)], ids=str)
def test_generation_batch_size_and_steps_per_generation_cut_the_batch(tiny_model_dir, tmp_path, size):
    """Either field sets the other (TRL takes one of the two): 12 episodes of 4 per micro-step make 3 micro-steps."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        respond=half_right_answers,
        gradient_accumulation_steps=3,
        **size,
        **ONE_STEP,
    )
    assert (trainer.args.generation_batch_size, trainer.args.steps_per_generation) == (12, 3)
    runs = recorded_rows(trainer)
    trainer.train()
    assert [len(rows) for rows in runs] == [12]  # one rollout of 3 prompts x 4 episodes, cut in 3 micro-steps
    assert [len(part) for part in trainer._buffered_micro_batches] == [4, 4, 4]


def test_num_iterations_trains_each_generation_batch_again(tiny_model_dir, tmp_path):
    def rollouts(iterations: int) -> int:
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / str(iterations),
            SingleAgent(),
            respond=half_right_answers,
            num_iterations=iterations,
            **{**ONE_STEP, "max_steps": 2},
        )
        runs = recorded_rows(trainer)
        trainer.train()
        return len(runs)

    assert rollouts(1) == 2 and rollouts(2) == 1


def test_scale_rewards_scales_the_advantages(tiny_model_dir, tmp_path):
    def advantages(scale: str) -> torch.Tensor:
        trainer = tiny_trainer(
            tiny_model_dir, tmp_path / scale, SingleAgent(), respond=half_right_answers, scale_rewards=scale
        )
        rows = [row for row in addition_dataset(1) for _ in range(4)]
        trainer.model.train()
        return trainer._generate_and_score(rows).advantages

    centred, scaled = advantages("none"), advantages("group")
    assert centred.abs().sum() > 0
    assert torch.allclose(scaled, centred / (centred.std() + 1e-4), atol=1e-5)


def test_mask_truncated_completions_leaves_cut_calls_out(tiny_model_dir, tmp_path):
    def batch(mask: bool):
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / str(mask),
            SingleAgent(),
            max_completion_length=2,
            mask_truncated_completions=mask,
        )
        rows = [row for row in addition_dataset(1) for _ in range(4)]
        trainer.model.train()
        return trainer._generate_and_score(rows)

    kept, masked = batch(mask=False), batch(mask=True)
    assert masked.truncated.any()
    assert (kept.completion_mask[kept.truncated].sum(1) > 0).all()
    assert masked.completion_mask[masked.truncated].sum() == 0


# ------------------------------------------------------------------------------------------------------------ loss
@pytest.fixture(scope="module")
def fixed_batch(tiny_model_dir, tmp_path_factory):
    """A rolled-out batch of SingleAgent calls whose log-probs before the update differ from the policy's (ratios
    away from 1 on both sides), as after a first update."""
    trainer = tiny_trainer(tiny_model_dir, tmp_path_factory.mktemp("base"), SingleAgent(), respond=half_right_answers)
    trainer.model.train()
    batch = trainer._generate_and_score([row for row in addition_dataset(2) for _ in range(4)])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logps = trainer._logps_and_entropies(trainer.model, *batch.model_inputs())[0]
    batch.old_per_token_logps = logps + (torch.rand(logps.shape, generator=generator) - 0.5) * 1.5
    assert batch.advantages.abs().sum() > 0
    return batch


def loss_on(batch, tiny_model_dir, folder, **settings) -> float:
    trainer = tiny_trainer(tiny_model_dir, folder, SingleAgent(), respond=half_right_answers, seed=0, **settings)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop
    with torch.no_grad():
        return trainer.compute_loss(trainer.model, loss_ready(batch, trainer.loss_type)).item()


@pytest.mark.parametrize(
    "base, changed",
    [
        (dict(loss_type="dapo"), dict(loss_type="cispo")),
        (dict(loss_type="dapo"), dict(epsilon=0.05)),
        (dict(loss_type="dapo"), dict(epsilon_high=0.05)),
        (dict(loss_type="dapo"), dict(delta=1.05)),
        (dict(loss_type="grpo"), dict(importance_sampling_level="sequence")),
        (dict(loss_type="dapo"), dict(top_entropy_quantile=0.3)),
        (dict(loss_type="dapo"), dict(off_policy_mask_threshold=1e-4)),
        (dict(loss_type="sapo"), dict(sapo_temperature_neg=5.0)),
        (dict(loss_type="sapo"), dict(sapo_temperature_pos=5.0)),
        (dict(loss_type="vespo"), dict(vespo_k_pos=0.5)),
        (dict(loss_type="vespo"), dict(vespo_lambda_pos=0.5)),
        (dict(loss_type="vespo"), dict(vespo_k_neg=0.5)),
        (dict(loss_type="vespo"), dict(vespo_lambda_neg=0.5)),
    ],
    ids=lambda settings: ",".join(f"{k}={v}" for k, v in settings.items()),
)
def test_trl_loss_fields_change_the_trainers_loss(fixed_batch, tiny_model_dir, tmp_path, base, changed):
    before = loss_on(fixed_batch, tiny_model_dir, tmp_path / "base", **base)
    after = loss_on(fixed_batch, tiny_model_dir, tmp_path / "changed", **{**base, **changed})
    assert after != pytest.approx(before, rel=1e-4)


def test_use_bias_correction_kl_weighs_the_kl_term_by_the_ratio(fixed_batch, tiny_model_dir, tmp_path):
    """TRL's default multiplies each token's KL to the base model by the policy's ratio to the log-probs before the
    update; the fixed batch's ratios are away from 1, so the two losses differ."""
    anchored = dataclasses.replace(fixed_batch, ref_per_token_logps=fixed_batch.old_per_token_logps - 0.3)

    def loss(correction: bool) -> float:
        settings = dict(loss_type="dapo", beta=0.5, use_bias_correction_kl=correction)
        return loss_on(anchored, tiny_model_dir, tmp_path / str(correction), **settings)

    assert loss(True) != pytest.approx(loss(False), rel=1e-4)


def test_vllm_importance_sampling_fields_shape_the_ratio(tmp_path):
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, -1.0]])
    batch = types.SimpleNamespace(
        old_per_token_logps=old,
        sampling_per_token_logps=torch.tensor([[-2.0, -0.5, -1.0], [-1.0, -1.0, -1.0]]),
        completion_mask=torch.ones(2, 3),
    )

    def ratio(**settings) -> torch.Tensor:
        return batch_importance_sampling_ratio(batch, tiny_config(tmp_path, **settings))

    e = torch.e
    assert torch.allclose(
        ratio(vllm_importance_sampling_mode="token_truncate"), torch.tensor([[e, e**-0.5, 1], [1, 1 / e, 1]])
    )
    assert torch.allclose(
        ratio(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0),
        torch.tensor([[2.0, e**-0.5, 1], [1, 1 / e, 1]]),
    )
    assert torch.allclose(  # e stays under TRL's default upper bound, 3; 1/e falls under 0.5
        ratio(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.5),
        torch.tensor([[e, e**-0.5, 1], [1, 0.0, 1]]),
    )
    assert torch.allclose(
        ratio(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=2.0),
        torch.tensor([[0.0, e**-0.5, 1], [1, 1 / e, 1]]),
    )
    assert torch.allclose(ratio(vllm_importance_sampling_mode="sequence_mask"), torch.tensor([[e**0.5], [1 / e]]))
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_cap"):  # TRL's deprecation, TRL's mapping
        capped = ratio(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_cap=1.5)
    assert capped.max().item() == pytest.approx(1.5)


class ReportsSamplerLogprobs(ScriptedBackend):
    """Scripted rollouts reporting the sampler's log-prob of each completion token, as vLLM's do: -1 each."""

    def generate(self, requests):
        results = super().generate(requests)
        for result in results:
            result.sampling_logprobs = [-1.0] * len(result.completion_ids)
        return results


def test_vllm_sampling_correction_reweighs_the_calls(tiny_model_dir, tmp_path):
    """With the correction, each token's loss is weighed by TRL's ratio of the trainer's probability over the
    sampler's; without it, the sampler's log-probs are kept but weigh nothing."""

    def scored(correction: bool):
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / str(correction),
            SingleAgent(),
            backend=ReportsSamplerLogprobs(AutoTokenizer.from_pretrained(tiny_model_dir), half_right_answers),
            rollout_backend="vllm",
            vllm_importance_sampling_correction=correction,
            vllm_importance_sampling_mode="token_truncate",
        )
        trainer.model.train()
        return trainer._generate_and_score([row for row in addition_dataset(1) for _ in range(4)])

    corrected, plain = scored(True), scored(False)
    assert plain.sampling_per_token_logps is not None and plain.importance_sampling_ratio is None
    mask = corrected.completion_mask
    expected = torch.clamp(torch.exp((corrected.old_per_token_logps + 1.0) * mask), max=3.0)
    assert torch.allclose(corrected.importance_sampling_ratio, expected)
    assert (expected[mask.bool()] - 1).abs().min() > 1e-3  # every sampled token reweighed
    unweighed = dataclasses.replace(corrected, importance_sampling_ratio=None)
    folder = tmp_path / "loss"
    assert loss_on(corrected, tiny_model_dir, folder) != pytest.approx(loss_on(unweighed, tiny_model_dir, folder))


# ------------------------------------------------------------------------------------------------------ generation
def generate_calls(trainer) -> list:
    """The generation config of every `generate` call of the trainer's transformers backend."""
    configs, generate = [], trainer.model.generate

    def recorded(*args, generation_config=None, **kwargs):
        configs.append(generation_config)
        return generate(*args, generation_config=generation_config, **kwargs)

    trainer.model.generate = recorded
    return configs


def test_trl_sampling_fields_reach_every_generate_call(tiny_model_dir, tmp_path):
    settings = dict(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.2,
        max_completion_length=5,
        generation_kwargs={"no_repeat_ngram_size": 3},
        cache_implementation="static",
    )
    trainer = tiny_trainer(tiny_model_dir, tmp_path, Voting(), policy_sharing="isolated", **settings, **ONE_STEP)
    configs = generate_calls(trainer)
    caches = []
    attention = trainer.model.get_base_model().model.layers[0].self_attn
    attention.register_forward_pre_hook(
        lambda module, args, kwargs: caches.append(type(kwargs.get("cache", kwargs.get("past_key_values")))),
        with_kwargs=True,
    )
    trainer.train()
    assert configs and caches
    for config in configs:
        assert (config.temperature, config.top_p, config.top_k, config.min_p) == (0.7, 0.9, 5, 0.05)
        assert (config.repetition_penalty, config.max_new_tokens, config.no_repeat_ngram_size) == (1.2, 5, 3)
    seen = {cache.__name__ for cache in caches}  # None in the training forwards
    assert "StaticCache" in seen and "DynamicCache" not in seen


@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.8.0"), reason="continuous batching needs transformers >= 5.8"
)
@pytest.mark.parametrize("switch", ["use_transformers_continuous_batching", "use_transformers_paged"])
def test_continuous_batching_generates_each_adapters_calls(tiny_model_dir, tmp_path, switch, recwarn):
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        policy_sharing="isolated",
        max_completion_length=6,
        generation_kwargs={"do_sample": False},
        transformers_continuous_batching_config={"num_blocks": 32, "block_size": 16, "max_batch_tokens": 64},
        **{switch: True},
    )
    backend = trainer.rollout_backend
    assert backend.continuous_batching.num_blocks == 32 and backend.continuous_batching.max_memory_percent == 0.5
    with torch.no_grad():
        for i, (name, param) in enumerate(trainer.model.named_parameters()):
            if "lora_B" in name:  # adapters that differ, so that routing shows
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(i)) * 0.5)
    requests = [
        GenerationRequest(adapter, [{"role": "user", "content": f"What is {i} + 2?"}])
        for i, adapter in enumerate(["generator", "aggregator", "generator", "__base__"])
    ]
    batched = [result.completion_ids for result in backend.generate(requests)]
    backend.continuous_batching = None  # the same requests through `generate`
    padded = [result.completion_ids for result in backend.generate(requests)]
    assert batched == padded and len({tuple(ids) for ids in batched}) > 1


def test_ds3_gather_for_generation_reaches_the_unwrap(tiny_model_dir, tmp_path, monkeypatch):
    from trl_multiagent.trainer import grpo_seam

    asked = []

    def unwrapped(model, accelerator, *, gather_deepspeed3_params, gradient_checkpointing_kwargs):
        asked.append((gather_deepspeed3_params, gradient_checkpointing_kwargs))

    monkeypatch.setattr(grpo_seam, "unwrapped_for_generation", unwrapped)
    for gather in (True, False):
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / str(gather),
            SingleAgent(),
            ds3_gather_for_generation=gather,
            gradient_checkpointing_kwargs={"use_reentrant": True},
        )
        trainer._unwrapped_for_generation()
    assert asked == [(True, {"use_reentrant": True}), (False, {"use_reentrant": True})]


@pytest.mark.skipif(TRL_BELOW_1_15, reason="TRL 1.14.2's unwrap for generation leaves gradient checkpointing alone")
def test_gradient_checkpointing_keeps_its_kwargs_after_a_rollout(tiny_model_dir, tmp_path):
    """TRL's unwrap for generation turns checkpointing off for the rollout and on again after it, with the kwargs it
    is given: without them the layers came back with transformers' defaults (``use_reentrant=False`` in 5.x), not the
    run's."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": True},
        max_steps=2,
    )
    trainer.train()
    layers = [m for m in trainer.model.modules() if hasattr(m, "_gradient_checkpointing_func")]
    assert layers and all(m._gradient_checkpointing_func.keywords == {"use_reentrant": True} for m in layers)


# ------------------------------------------------------------------------------------------------------------ vLLM
class Recorder:
    """Stands in for a vLLM backend class: records what it was built with."""

    built: list[dict] = []

    def __init__(self, *args, **kwargs):
        Recorder.built.append({"args": args, **kwargs})


@pytest.fixture
def recorded_backends(monkeypatch):
    from trl_multiagent.rollout.backends import vllm_backend, vllm_server

    Recorder.built = []
    for module, name in (
        (vllm_backend, "VLLMBackend"),
        (vllm_backend, "AsyncVLLMBackend"),
        (vllm_server, "VLLMServerBackend"),
    ):
        monkeypatch.setattr(module, name, type(name, (Recorder,), {}))
    return Recorder.built


def test_vllm_fields_reach_the_colocated_engine(tiny_model_dir, tmp_path, recorded_backends):
    tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        use_vllm=True,
        vllm_model_impl="transformers",
        vllm_gpu_memory_utilization=0.25,
        vllm_max_model_length=96,
        trust_remote_code=True,
        temperature=0.6,
        top_p=0.8,
        top_k=7,
        min_p=0.1,
        repetition_penalty=1.1,
        max_completion_length=9,
        generation_kwargs={"seed": 3},
    )
    (engine,) = recorded_backends
    assert (engine["model_impl"], engine["gpu_memory_utilization"], engine["max_model_len"]) == (
        "transformers",
        0.25,
        96,
    )
    assert engine["trust_remote_code"] is True
    sampling = engine["sampling"]
    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"], sampling["min_p"]) == (0.6, 0.8, 7, 0.1)
    assert (sampling["repetition_penalty"], sampling["max_tokens"], sampling["seed"]) == (1.1, 9, 3)


@pytest.mark.parametrize(
    "server, url",
    [
        (dict(vllm_server_host="10.0.0.7", vllm_server_port=8123), "http://10.0.0.7:8123"),
        (dict(vllm_server_base_url="http://node3:9000"), "http://node3:9000"),
    ],
)
def test_use_vllm_in_server_mode_reaches_the_server_trl_names(
    tiny_model_dir, tmp_path, recorded_backends, server, url
):
    """What a TRL user sets for `trl vllm-serve` selects the vLLM rollouts: `use_vllm`, `vllm_mode`, the server's
    address and start-up timeout."""
    trainer = tiny_trainer(
        tiny_model_dir, tmp_path, SingleAgent(), use_vllm=True, vllm_mode="server", vllm_server_timeout=17.0, **server
    )
    assert (trainer.args.rollout_backend, trainer.args.use_vllm) == ("vllm", True)
    (built,) = recorded_backends
    assert built["args"][0] == [url] and built["timeout"] == 17.0
    assert type(trainer.rollout_backend).__name__ == "VLLMServerBackend"


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_use_vllm_reads_as_set_and_trls_own_vllm_client_never_starts(
    tiny_model_dir, tmp_path, recorded_backends, monkeypatch, mode
):
    """`use_vllm=True` stays True on the config, after the trainer is built and in the saved settings, while the
    rollouts stay ours: TRL's `VLLMGeneration` (its colocated engine or `trl vllm-serve` client) is never built."""
    grpo_trainer = importlib.import_module("trl.trainer.grpo_trainer")
    started = []
    monkeypatch.setattr(grpo_trainer, "VLLMGeneration", lambda **kwargs: started.append(kwargs))
    args = tiny_config(tmp_path, use_vllm=True, vllm_mode=mode)
    assert args.use_vllm is True and args.rollout_backend == "vllm"
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_dir,
        workflow=SingleAgent(),
        reward_funcs=boxed_answer_reward,
        args=args,
        train_dataset=addition_dataset(),
        peft_config=tiny_lora(),
    )
    assert started == [] and not hasattr(trainer, "vllm_generation")
    assert trainer.args is args and args.use_vllm is True
    assert len(recorded_backends) == 1  # our backend instead
    assert json.loads(args.to_json_string())["use_vllm"] is True
    trainer.save_model(str(tmp_path / "saved"))
    saved = torch.load(tmp_path / "saved" / "training_args.bin", weights_only=False)
    assert (saved.use_vllm, saved.rollout_backend) == (True, "vllm")


# --------------------------------------------------------------------------------------------------------- logging
def test_completion_logging_fields_shape_trls_table(tiny_model_dir, tmp_path, monkeypatch):
    """`log_completions` writes TRL's completions table (its parquet files), printed with `num_completions_to_print`
    rows, sent to trackio/wandb once per prompt under `log_unique_prompts`, uploaded to `log_completions_hub_repo`."""
    grpo_trainer = importlib.import_module("trl.trainer.grpo_trainer")
    printed, tables, scheduled = [], [], []

    class Card:
        @classmethod
        def from_template(cls, *args, **kwargs):
            return cls()

        def push_to_hub(self, repo_id):
            pass

    fake_trackio = types.SimpleNamespace(Table=lambda dataframe: dataframe, log=lambda logged: tables.append(logged))
    monkeypatch.setattr(grpo_trainer, "create_repo", lambda *args, **kwargs: None)
    monkeypatch.setattr(grpo_trainer, "DatasetCard", Card)
    monkeypatch.setattr(grpo_trainer, "CommitScheduler", lambda **kwargs: scheduled.append(kwargs))
    monkeypatch.setattr(grpo_trainer, "is_rich_available", lambda: True)
    monkeypatch.setattr(grpo_trainer, "print_prompt_completions_sample", lambda *args, **kwargs: printed.append(args))
    monkeypatch.setattr(grpo_trainer, "trackio", fake_trackio, raising=False)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        respond=half_right_answers,
        log_completions=True,
        num_completions_to_print=2,
        log_unique_prompts=True,
        log_completions_hub_repo="someone/completions",
        **ONE_STEP,
    )
    monkeypatch.setattr(trainer.args, "report_to", ["trackio"])
    trainer.train()
    assert scheduled[0]["repo_id"] == "someone/completions"
    assert scheduled[0]["folder_path"] == f"{tmp_path}/completions"
    assert list((tmp_path / "completions").glob("*.parquet"))
    assert printed and printed[0][5] == 2  # TRL prints num_completions_to_print rows
    table = tables[0]["completions"]  # the step's log (the end of training logs it again)
    assert len(table) == 1 and "role/generator" in table.columns  # 1 prompt x 4 episodes: one row per prompt
