"""Roles on different base models (`role_models`): a judge on a second tiny Qwen3 with another hidden size and another
tokenizer, trained beside the generator on the first, with one optimizer."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import transformers.trainer
from checkpoints.test_hub import FakeHubApi
from harness import ROOT, TESTS, run_offline
from preemption import assert_resume_after_sigkill_matches, launch_worker
from safetensors.torch import load_file
from scripted import addition_dataset
from tiny import tiny_trainer
from transformers import AutoTokenizer, GenerationConfig

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer, OrchWorkers
from trl_multiagent.adapters.bases import Bases, adapters_on_bases
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.checkpoints import load_base_workflow, load_trained_workflow
from trl_multiagent.evaluation import make_generation_config, run_episodes
from trl_multiagent.rollout.backends.from_config import build_backend
from trl_multiagent.rollout.chat_rendering import ChatRenderer
from trl_multiagent.rollout.engine import RolloutEngine


def length_parity_reward(completions, **kwargs) -> list[float]:
    """Varies with the (random) final answer, so every group of episodes carries advantage."""
    return [float(len(c[0]["content"]) % 2) for c in completions]


def two_model_trainer(tiny_model_dir, tiny_judge_dir, output_dir, **overrides):
    settings = dict(
        max_steps=2,
        logging_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        seed=0,
        policy_sharing="isolated",
        role_models={"evaluator": tiny_judge_dir},
    )
    settings.update(overrides)
    return tiny_trainer(
        tiny_model_dir, output_dir, EvalOpt(max_iterations=2), reward_funcs=length_parity_reward, **settings
    )


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before, model) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}


def record_episodes(trainer) -> list:
    episodes, run = [], trainer.engine.run
    trainer.engine.run = lambda prompts: episodes.extend(result := run(prompts)) or result
    return episodes


def test_evaluation_runs_each_base_in_its_own_forward(tiny_model_dir, tiny_judge_dir, tmp_path):
    """`evaluate()` with roles on two bases: the evaluation batch's loss runs one forward per base (a forward cannot
    mix them), and both roles' loss metrics are logged."""
    settings = dict(per_device_eval_batch_size=4, num_generations_eval=2, seed=0, policy_sharing="isolated")
    settings.update(role_models={"evaluator": tiny_judge_dir}, save_strategy="no")
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        eval_dataset=addition_dataset(4),
        reward_funcs=length_parity_reward,
        **settings,
    )
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"])
    assert all(f"eval_role/{role}/entropy" in metrics for role in ("generator", "evaluator"))


@pytest.mark.parametrize("frozen", ["generator", "evaluator"])
def test_two_bases_train_and_only_the_advantaged_base_moves(tiny_model_dir, tiny_judge_dir, tmp_path, frozen):
    trainer = two_model_trainer(tiny_model_dir, tiny_judge_dir, tmp_path, role_loss_weights={frozen: 0.0})
    judge = trainer.bases.extra[tiny_judge_dir]
    assert trainer.model.config.hidden_size == 64 and judge.model.config.hidden_size == 32
    main_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "What is 13 + 2? The evaluator answers \\boxed{Correct}"
    assert main_tokenizer(text)["input_ids"] != judge.tokenizer(text)["input_ids"]  # really another tokenizer
    assert trainer.role_adapters == {"generator": "generator", "evaluator": "evaluator"}
    assert list(trainer.model.peft_config) == ["generator"] and list(judge.model.peft_config) == ["evaluator"]

    episodes = record_episodes(trainer)
    main_before, judge_before = snapshot(trainer.model), snapshot(judge.model)
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["workflow/samples_trained"] == h["workflow/samples_generated"] for h in logs)
    for role in ("generator", "evaluator"):  # per-role metrics name both roles
        assert all(f"role/{role}/calls" in h and f"role/{role}/entropy" in h for h in logs)
    assert any(h[f"role/{'evaluator' if frozen == 'generator' else 'generator'}/grad_norm"] > 0 for h in logs)

    # Every call ran on its own base, its prompt tokenized by that base's tokenizer and chat template.
    calls = [c for e in episodes for c in e.calls]
    assert {c.role for c in calls} == {"generator", "evaluator"}
    for call in calls:
        tokenizer, base = (judge.tokenizer, tiny_judge_dir) if call.role == "evaluator" else (main_tokenizer, None)
        assert call.base == (base or trainer.bases.main)
        assert call.prompt_ids == ChatRenderer(tokenizer).prompt_ids(call.messages)

    assert all(p.grad is None for p in judge.model.parameters())  # cleared after each step, as the Trainer's model's
    moved_main, moved_judge = changed(main_before, trainer.model), changed(judge_before, judge.model)
    generator = set(adapter_parameters(trainer.model, "generator"))
    evaluator = set(adapter_parameters(judge.model, "evaluator"))
    if frozen == "generator":  # only the evaluator's samples carry advantage: only the judge's adapter moves
        assert not moved_main
        assert moved_judge and moved_judge <= evaluator
    else:
        assert not moved_judge
        assert moved_main and moved_main <= generator


def test_shared_policy_gets_one_adapter_per_base(tiny_model_dir, tiny_judge_dir, tmp_path):
    judging = {"orchestrator": tiny_judge_dir, "synthesizer": tiny_judge_dir}
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        OrchWorkers(),
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        policy_sharing="shared",
        role_models=judging,
        monitor_role_grad_norms=True,
        reward_funcs=length_parity_reward,
    )
    judge = trainer.bases.extra[tiny_judge_dir]
    shared = f"shared-{tiny_judge_dir.rstrip('/').split('/')[-1]}"
    assert trainer.role_adapters == {"orchestrator": shared, "worker": "shared", "synthesizer": shared}
    # the two judging roles share the judge base's adapter: each gets a shadow there, for its own gradient norm
    assert set(judge.model.peft_config) == {shared, f"{shared}__role_orchestrator", f"{shared}__role_synthesizer"}
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(log["loss"])
    assert log["role/orchestrator/grad_norm"] > 0 and log["role/synthesizer/grad_norm"] > 0


def test_an_adapter_cannot_span_two_bases(tiny_model_dir, tiny_judge_dir, tmp_path):
    with pytest.raises(ValueError, match="serves roles on different base models"):
        tiny_trainer(
            tiny_model_dir,
            tmp_path,
            EvalOpt(),
            save_strategy="no",
            role_to_adapter={"generator": "both", "evaluator": "both"},
            role_models={"evaluator": tiny_judge_dir},
        )
    placed, bases = adapters_on_bases({"a": "x", "b": "y"}, {"a": "m", "b": "j"}, "m", explicit=True)
    assert placed == {"a": "x", "b": "y"} and bases == {"x": "m", "y": "j"}


def test_unknown_role_in_role_models_is_named(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"`role_models` names role\(s\) \['judge'\]"):
        tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(), role_models={"judge": tiny_model_dir})
    with pytest.raises(ValueError, match="must be a dict of role -> model name"):
        tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(), role_models={"evaluator": ""})


def test_role_model_naming_the_main_model_stays_on_it(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(),
        dataset=addition_dataset(4),
        save_strategy="no",
        policy_sharing="shared",
        role_models={"evaluator": tiny_model_dir},
    )
    assert trainer.bases.extra == {}
    assert trainer.role_adapters == {"generator": "shared", "evaluator": "shared"}


# ------------------------------------------------------------------------------------------ checkpoints and loading
@pytest.fixture(scope="module")
def trained(tiny_model_dir, tiny_judge_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("two-models-run")
    trainer = two_model_trainer(tiny_model_dir, tiny_judge_dir, output_dir, save_strategy="steps", save_steps=2)
    trainer.train()
    return trainer, output_dir / "checkpoint-2"


def trainer_greedy(trainer, prompts):
    """Greedy episodes through the trainer's own rollout path (one backend per base), its sampling turned off."""
    sampling = trainer.generation_config
    trainer.generation_config = GenerationConfig(**{**trainer.generation_kwargs, "do_sample": False})
    try:
        backend = build_backend(trainer.args, trainer._backend_context())
    finally:
        trainer.generation_config = sampling
    engine = RolloutEngine(trainer.workflow, backend, trainer.role_adapters, base_for_role=trainer.bases.role_base)
    return engine.run(prompts)


def calls(episodes):
    return [[(c.role, c.adapter, c.completion_ids) for c in e.calls] for e in episodes]


def test_saved_run_rebuilds_and_reproduces_greedy_outputs(trained, tiny_judge_dir):
    trainer, checkpoint = trained
    config = json.loads((checkpoint / "multiagent_config.json").read_text())
    assert config["role_models"] == {"evaluator": tiny_judge_dir}
    assert config["adapter_models"] == {"evaluator": tiny_judge_dir}
    assert (checkpoint / "generator" / "adapter_model.safetensors").is_file()
    assert (checkpoint / "evaluator" / "adapter_model.safetensors").is_file()

    loaded = load_trained_workflow(checkpoint)
    assert list(loaded.model.peft_config) == ["generator"]
    judge = loaded.bases[tiny_judge_dir]
    assert list(judge.model.peft_config) == ["evaluator"] and judge.model.config.hidden_size == 32
    assert loaded.role_bases == {"evaluator": tiny_judge_dir}
    trained_judge = trainer.bases.extra[tiny_judge_dir].model
    moved = {n: p for n, p in trained_judge.named_parameters() if "lora_B" in n}
    assert any(p.abs().sum() > 0 for p in moved.values())  # the judge's adapter trained away from its zero init
    reloaded = dict(judge.model.named_parameters())
    assert all(torch.equal(p, reloaded[n]) for n, p in moved.items())

    prompts = [row["prompt"] for row in addition_dataset(5)]
    expected = trainer_greedy(trainer, prompts)
    actual = run_episodes(loaded, prompts, make_generation_config(loaded, max_new_tokens=8))
    assert calls(actual) == calls(expected)
    assert [e.final_answer for e in actual] == [e.final_answer for e in expected]
    with torch.no_grad():  # without the trained judge adapter the evaluator's outputs change: the match is no accident
        for name in moved:
            reloaded[name].zero_()
    untrained = run_episodes(loaded, prompts, make_generation_config(loaded, max_new_tokens=8))
    judged = [[c.completion_ids for c in e.calls if c.role == "evaluator"] for e in untrained]
    assert judged != [[c.completion_ids for c in e.calls if c.role == "evaluator"] for e in expected]


@pytest.mark.slow
def test_sigkill_after_checkpoint_then_resume_matches(tiny_model_dir, tiny_judge_dir, tmp_path):
    def launch(output_dir: str, *checkpoint: str):
        args = (tiny_model_dir, tiny_judge_dir, output_dir, *checkpoint)
        return launch_worker("kill_worker_role_models.py", *args, log=f"{output_dir}.log")

    assert_resume_after_sigkill_matches(launch, tmp_path, adapters=("generator", "evaluator"))  # both bases'


def test_untrained_bases_per_role_run_through_their_own_tokenizers(tiny_model_dir, tiny_judge_dir):
    base = load_base_workflow(tiny_model_dir, EvalOpt(max_iterations=1), role_models={"evaluator": tiny_judge_dir})
    episodes = run_episodes(base, [row["prompt"] for row in addition_dataset(2)], make_generation_config(base, 6))
    judge_tokenizer = base.bases[tiny_judge_dir].tokenizer
    for call in (c for e in episodes for c in e.calls):
        tokenizer = judge_tokenizer if call.role == "evaluator" else base.tokenizer
        assert call.base == (tiny_judge_dir if call.role == "evaluator" else None)
        assert call.prompt_ids == ChatRenderer(tokenizer).prompt_ids(call.messages)
    with pytest.raises(ValueError, match=r"names role\(s\) \['judge'\]"):
        load_base_workflow(tiny_model_dir, EvalOpt(), role_models={"judge": tiny_judge_dir})


def test_fp32_lm_head_with_several_bases_is_refused(tiny_model_dir, tiny_judge_dir, tmp_path):
    """DeepSpeed is supported (tests/training/test_deepspeed_role_models.py); the fp32 LM head is not."""
    trainer = tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(), save_strategy="no", policy_sharing="isolated")
    args = trainer.args
    args.role_models, args.cast_lm_head_to_fp32 = {"evaluator": tiny_judge_dir}, True
    with pytest.raises(
        ValueError, match="do not support `cast_lm_head_to_fp32`: it is applied to the trainer's model"
    ):
        Bases.from_config(args, peft_model=trainer.model, role_adapters=trainer.role_adapters, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_two_processes_keep_every_base_in_step(tiny_model_dir, tiny_judge_dir, tmp_path, schedule):
    """torchrun, 2 processes (DDP over gloo): the ranks train on different episodes, and end with the same adapters
    on both bases (the trainer's averaged by DDP, the judge's here); under mini_batches the judge's mini-batches hold
    none of the trainer's base's samples, so every rank adds the zero-weight stand-in that keeps DDP in step."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29531",
        str(TESTS / "workers" / "ddp_role_models_worker.py"),
        tiny_model_dir,
        tiny_judge_dir,
        str(tmp_path),
        schedule,
    ]
    run_offline(command, timeout=300)  # a DDP hang times out
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world_size"] == 2 for r in ranks)
    assert ranks[0]["completions"] != ranks[1]["completions"]  # each rank trained on its own episodes
    weights = [load_file(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    before = load_file(tmp_path / "rank0-before.safetensors")
    for role in ("generator", "evaluator"):
        keys = [k for k in weights[0] if k.startswith(f"{role}/")]
        assert keys and all(torch.equal(weights[0][k], weights[1][k]) for k in keys), role
        assert any(not torch.equal(before[k], weights[0][k]) for k in keys), role


@pytest.mark.slow
def test_two_model_toy_preset_runs_at_minimum_size(tiny_model_dir, tiny_judge_dir, tmp_path):
    """recipes/configs/toy_two_models.yaml through the Eval-Opt recipe, its models swapped for the tiny ones."""
    command = [
        sys.executable,
        "recipes/eval_opt_math.py",
        "--config",
        "recipes/configs/toy_two_models.yaml",
        "--model_name_or_path",
        tiny_model_dir,
        "--role_models",
        json.dumps({"evaluator": tiny_judge_dir}),
        "--output_dir",
        str(tmp_path),
        "--max_steps",
        "1",
        "--save_steps",
        "1",
        "--per_device_train_batch_size",
        "8",
        "--num_generations",
        "4",
        "--max_completion_length",
        "8",
        "--disable_tqdm",
        "true",
    ]
    run_offline(command, cwd=ROOT)
    config = json.loads((tmp_path / "multiagent_config.json").read_text())
    assert config["role_models"] == {"evaluator": tiny_judge_dir} and config["policy_sharing"] == "isolated"
    for adapter in ("generator", "evaluator"):
        assert (tmp_path / "checkpoint-1" / adapter / "adapter_model.safetensors").is_file()


def test_push_to_hub_carries_every_base(tiny_model_dir, tiny_judge_dir, tmp_path, monkeypatch):
    api = FakeHubApi(tmp_path / "uploaded")
    if hasattr(transformers.trainer, "hf_api"):  # transformers >= 5.10 uploads through hf_api(), before the module's
        monkeypatch.setattr(transformers.trainer, "hf_api", lambda *a, **k: api)
    else:
        monkeypatch.setattr(transformers.trainer, "upload_folder", api.upload_folder)
    monkeypatch.setattr(MultiAgentGRPOTrainer, "init_hf_repo", lambda self, token=None: None)
    trainer = two_model_trainer(tiny_model_dir, tiny_judge_dir, tmp_path / "run", max_steps=1)
    trainer.hub_model_id = "me/eval-opt-two-models"
    trainer.train()
    trainer.push_to_hub()

    uploaded = tmp_path / "uploaded"
    for adapter in ("generator", "evaluator"):
        assert (uploaded / adapter / "adapter_model.safetensors").is_file()
    card = (uploaded / "README.md").read_text()
    assert f"| `evaluator` | `evaluator/` | `{tiny_judge_dir}` |" in card
    assert f"| `generator` | `generator/` | `{tiny_model_dir}` |" in card
    assert f"base_model: {tiny_judge_dir}" in (uploaded / "evaluator" / "README.md").read_text()
    rebuilt = load_trained_workflow(uploaded)
    assert set(rebuilt.bases) == {tiny_judge_dir} and list(rebuilt.bases[tiny_judge_dir].model.peft_config) == [
        "evaluator"
    ]
