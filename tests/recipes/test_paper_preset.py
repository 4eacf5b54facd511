"""The recipes' paper preset against the reference's own configuration files, setting by setting.

Each expected value below is what the reference stack runs with, read from its files (paths in XHMY/marl-llm-workflows
at 6eafb3c, and in upstream verl for what its config leaves to verl's defaults: `verl/...`). The tests run each recipe
as `accelerate launch recipes/<recipe>.py` runs it without `--config` (its own parser reading its task's paper preset,
recipes/configs/paper_<task>.yaml) up to its trainer, and compare what the trainer would get.
docs/fidelity.md names these tests for every row they decide.
"""

from __future__ import annotations

import functools

import pytest
from presets import CONFIGS, ON_CPU, preset, recipe_trainer_kwargs

from trl_multiagent.tasks import get_task

# (field, the reference's value, where the reference sets it)
REFERENCE_SETTINGS = [
    ("lora_r", 64, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:16"),
    ("lora_alpha", 32, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:17"),
    ("lora_target_modules", ["all-linear"], "rllm/trainer/config/multi_agent_ppo_trainer.yaml:18"),
    ("lora_dropout", 0.0, "verl/workers/fsdp_workers.py:431-439 (no dropout given: PEFT's LoraConfig default, 0)"),
    ("num_generations", 8, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:42 (rollout.n)"),
    ("learning_rate", 2e-5, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:34"),
    ("warmup_steps", 15, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:35"),
    ("lr_scheduler_type", "cosine", "rllm/trainer/config/multi_agent_ppo_trainer.yaml:36"),
    ("weight_decay", 0.01, "verl/trainer/config/actor/actor.yaml:126"),
    ("epsilon", 0.2, "verl/trainer/config/actor/actor.yaml:36 (clip_ratio_low)"),
    ("epsilon_high", 0.28, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:28"),
    ("num_iterations", 1, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:32 (ppo_epochs)"),
    ("temperature", 0.7, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:43"),
    ("top_p", 1.0, "verl/trainer/config/rollout/rollout.yaml:17"),
    ("top_k", 0, "verl/trainer/config/rollout/rollout.yaml:14 (-1: off; TRL's 0 is off)"),
    ("beta", 0.0, "verl/trainer/config/actor/actor.yaml:78 (use_kl_loss: false)"),
    ("max_grad_norm", 1.0, "verl/trainer/config/actor/dp_actor.yaml:29 (grad_clip)"),
    ("max_steps", 500, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:154"),
    ("save_steps", 5, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:152"),
    ("chat_template_kwargs", {"enable_thinking": False}, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:106"),
    ("max_tokens_per_micro_batch", 51_200, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:26"),
    ("mini_batch_prompts", 64, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:23"),
    ("update_schedule", "mini_batches", "verl's actor: one optimizer step per ppo mini-batch (docs/fidelity.md)"),
    ("mini_batch_order", "reference", "verl/trainer/config/ppo_trainer.yaml:123 (balance_batch: True, v0.6.1)"),
    ("clip_grad_norm_per_adapter", True, "rllm/trainer/verl/agent_workflow_trainer.py: one update_actor per role"),
    ("chat_rendering", "reference_qwen", "rllm/engine/rollout/verl_engine.py:24,69-70 (rLLM's Qwen parser)"),
    ("vllm_importance_sampling_correction", False, "rllm/trainer/verl/agent_workflow_trainer.py:419-423"),
    ("old_logprobs", "recompute", "rllm/trainer/verl/agent_workflow_trainer.py:372-410 (compute_log_prob)"),
    ("delta", 3.0, "verl/trainer/config/actor/actor.yaml:69 (clip_ratio_c: the dual clip)"),
    ("advantage_groups", "calls", "rllm/trainer/verl/agent_workflow_trainer.py:473 (uid = step id)"),
    ("role_rewards", None, "dashboard/task_configs.py:46,50,54 (use_final_outcome_reward: the outcome)"),
    ("prompts_per_step", 64, "rllm/trainer/config/multi_agent_ppo_trainer.yaml:66 (train_batch_size, over all GPUs)"),
    ("lr_scheduler_steps", "per_update", "verl 0.6.1 fsdp_workers.py:888-890 (a scheduler step per update_actor)"),
]


WORKFLOWS, TASKS = ("eval_opt", "voting", "orch_workers", "single_agent"), ("math", "code")
TRAINING_RECIPES = [f"{workflow}_{task}" for workflow in WORKFLOWS for task in TASKS] + ["train"]
# The LoRA settings reach the trainer as its peft_config.
LORA = {
    "lora_r": "r",
    "lora_alpha": "lora_alpha",
    "lora_target_modules": "target_modules",
    "lora_dropout": "lora_dropout",
}


@functools.cache
def recipe_defaults(recipe: str) -> dict:
    """What ``recipe`` hands its trainer when launched without --config (on its task's offline dataset, which the
    tests can load, and in fp32 on this CPU machine)."""
    offline = "toy_code" if recipe.endswith("_code") else "arithmetic"
    return recipe_trainer_kwargs(recipe, "--output_dir", "unused", *ON_CPU, "--dataset_name", offline)


def effective(recipe: str, name: str):
    kwargs = recipe_defaults(recipe)
    if name in LORA:
        value = getattr(kwargs["peft_config"], LORA[name])
        return sorted(value) if isinstance(value, set) else [value] if name == "lora_target_modules" else value
    return getattr(kwargs["args"], name)


@pytest.mark.parametrize("name, reference, where", REFERENCE_SETTINGS, ids=[s[0] for s in REFERENCE_SETTINGS])
def test_the_paper_preset_sets_what_the_reference_runs_with(name, reference, where):
    for recipe in TRAINING_RECIPES:
        ours = effective(recipe, name)
        assert ours == reference, f"{recipe} {name}: the reference runs with {reference!r} ({where}), ours {ours!r}"
    for task in ("math", "code"):
        assert preset(f"paper_{task}")["bf16"] is True  # the reference trains in bf16 (FSDP mixed precision)


@pytest.mark.parametrize(
    "task, reference, where",
    [
        ("math", 5120, "examples/math_reasoning/train_multi_agent_math.sh:15 (data.max_response_length)"),
        ("code", 2048, "examples/deepcoder/train_deepcoder_voting.sh:26 (data.max_response_length)"),
    ],
)
def test_the_paper_completion_lengths_are_the_references(task, reference, where):
    for recipe in [r for r in TRAINING_RECIPES if r.endswith(f"_{task}") or (r, task) == ("train", "math")]:
        assert recipe_defaults(recipe)["args"].max_completion_length == reference, (recipe, where)
    # the dataset the recipes train on by default is the one the evaluation holds out from
    assert preset(f"paper_{task}")["dataset_name"] == get_task(task).dataset_id


def test_every_recipe_trains_the_paper_model_and_workflows_by_default():
    for recipe in TRAINING_RECIPES:
        kwargs = recipe_defaults(recipe)
        assert kwargs["model"] == "Qwen/Qwen3-1.7B", recipe
        workflow = kwargs["workflow"]
        assert workflow.prompts == "paper", recipe
        for option, paper in (("parsing", "reference"), ("history", "shared"), ("workers", "per_strategy")):
            assert getattr(workflow, option, paper) == paper, (recipe, option)
        assert getattr(workflow, "template", "generator") == "generator", recipe


def test_a_config_that_names_no_base_stands_in_for_the_paper_preset(tmp_path):
    """A --config file without `base:` stands in for the paper preset: what it leaves out takes the library default,
    as TRL's --config reads a file."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("model_name_or_path: my/model\nuse_peft: true\nuse_cpu: true\nmax_completion_length: 32\n")
    kwargs = recipe_trainer_kwargs(
        "voting_math", "--config", str(mine), "--output_dir", "unused", "--dataset_name", "arithmetic"
    )
    assert kwargs["model"] == "my/model" and kwargs["args"].max_completion_length == 32
    assert kwargs["args"].update_schedule == "merged" and kwargs["args"].learning_rate == 1e-6  # the library's
    assert kwargs["peft_config"].r == 16  # ModelConfig's default, not the paper's 64


@pytest.mark.parametrize("name", ["toy", "toy_code", "toy_two_models"])
def test_the_toy_presets_give_every_workflow_the_toy_models_requests(name):
    """One toy preset serves every recipe: each workflow takes the options it has from the same file."""
    toy = {"prompts": "guarded", "parsing": "robust", "history": "fresh", "workers": "fixed", "template": "raw"}
    for recipe in TRAINING_RECIPES:
        offline = "toy_code" if recipe.endswith("_code") else "arithmetic"
        args = ("--config", str(CONFIGS / f"{name}.yaml"), "--output_dir", "unused", "--dataset_name", offline)
        workflow = recipe_trainer_kwargs(recipe, *args)["workflow"]
        taken = {option: getattr(workflow, option) for option in toy if hasattr(workflow, option)}
        assert taken == {option: toy[option] for option in taken} and "prompts" in taken, (recipe, taken)


# What the toy figures in README were measured with (docs/fidelity.md, "What the toy presets choose"): each a switch
# away from the paper preset's value.
TOY_SETTINGS = {
    "update_schedule": "merged",
    "mini_batch_order": "episodes",
    "advantage_groups": "episodes",
    "lr_scheduler_steps": "per_training_step",
    "vllm_importance_sampling_correction": True,
    "delta": None,
    "chat_rendering": "tokenizer",
    "prompts_per_step": None,
    "rollout_max_batch_tokens": None,
}


@pytest.mark.parametrize("name", ["toy", "toy_code", "toy_two_models"])
def test_the_toy_presets_keep_the_settings_their_figures_were_measured_with(name):
    recipe, offline = ("eval_opt_code", "toy_code") if name == "toy_code" else ("eval_opt_math", "arithmetic")
    args = ("--config", str(CONFIGS / f"{name}.yaml"), "--output_dir", "unused", "--dataset_name", offline)
    trained_with = recipe_trainer_kwargs(recipe, *args)["args"]
    assert {field: getattr(trained_with, field) for field in TOY_SETTINGS} == TOY_SETTINGS
