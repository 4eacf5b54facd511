"""The shipped toy model: loadable by name, small, follows every role's format, and trains with the toy preset."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from harness import ROOT, needs_sandbox, run_offline
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from trl_multiagent.common.model_names import model_name, resolve_model_name
from trl_multiagent.evaluation.toy import WORKFLOWS, format_rates, held_out_dataset, load_policy, run_toy, successes
from trl_multiagent.toy import TOY_JUDGE_DIR, TOY_MODEL_DIR, TOY_SEARCH_DIR


def test_toy_name_resolves_to_the_packaged_model():
    assert resolve_model_name("toy") == TOY_MODEL_DIR
    assert resolve_model_name("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert model_name(TOY_MODEL_DIR) == "toy" and model_name(str(ROOT)) == str(ROOT)
    config = AutoConfig.from_pretrained(resolve_model_name("toy"))
    assert config.model_type == "qwen3"
    model = AutoModelForCausalLM.from_pretrained(TOY_MODEL_DIR)
    assert sum(p.numel() for p in model.parameters()) <= 10_000_000
    size = sum(f.stat().st_size for f in Path(TOY_MODEL_DIR).iterdir())
    assert size <= 20 * 2**20
    tokenizer = AutoTokenizer.from_pretrained(TOY_MODEL_DIR)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Ann has 3 pens."}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_toy_judge_is_a_smaller_model_with_its_own_tokenizer():
    assert resolve_model_name("toy-judge") == TOY_JUDGE_DIR and model_name(TOY_JUDGE_DIR) == "toy-judge"
    judge = AutoModelForCausalLM.from_pretrained(TOY_JUDGE_DIR)
    toy = AutoModelForCausalLM.from_pretrained(TOY_MODEL_DIR)
    assert judge.config.hidden_size < toy.config.hidden_size
    assert sum(p.numel() for p in judge.parameters()) <= 1_000_000
    judge_tokens, toy_tokens = (
        AutoTokenizer.from_pretrained(TOY_JUDGE_DIR),
        AutoTokenizer.from_pretrained(TOY_MODEL_DIR),
    )
    assert len(judge_tokens) != len(toy_tokens)
    text = "Step 1 (gives): 17 + 12 = 29. Wrong operation. \\boxed{Incorrect}"
    assert judge_tokens(text)["input_ids"] != toy_tokens(text)["input_ids"]


def test_toy_search_checks_where_one_pass_guesses():
    """toy-search before any RL, greedy on 100 held-out mod_search problems at the family's one-check budget: one
    pass stays near a guess among 4 candidates, Eval-Opt's judged retries find the answer far more often (the
    property the family is for; docs/toy.md, record V5). Every role's output parses."""
    assert resolve_model_name("toy-search") == TOY_SEARCH_DIR and model_name(TOY_SEARCH_DIR) == "toy-search"
    rows = held_out_dataset(100, "math", "mod_search").to_list()
    success = {}
    for workflow in ("single_agent", "eval_opt"):
        trained = load_policy("toy-search", workflow, "math")
        episodes = run_toy(trained, rows, "math", temperature=0.0, dataset="mod_search")
        assert set(format_rates(trained.workflow, episodes).values()) == {1.0}
        success[workflow] = sum(successes("math", episodes, rows)) / len(rows)
    assert success["single_agent"] <= 0.35 and success["eval_opt"] >= success["single_agent"] + 0.25, success


@pytest.mark.parametrize("task", ["math", "code"])
@pytest.mark.parametrize("workflow", list(WORKFLOWS))
def test_toy_model_follows_every_role_format(workflow, task):
    """Sampled at temperature 0.7 on 100 held-out problems of each task, each role's output parses >= 95% of the
    time."""
    trained = load_policy("toy", workflow, task)
    episodes = run_toy(trained, held_out_dataset(100, task).to_list(), task, temperature=0.7, seed=0)
    rates = format_rates(trained.workflow, episodes)
    assert set(rates) == set(trained.workflow.roles)
    assert all(rate >= 0.95 for rate in rates.values()), rates


@pytest.mark.slow
def test_toy_preset_trains_and_roles_still_parse(tmp_path):
    """A few steps of the toy preset, as a user launches it; then the trained roles still follow their formats."""
    output_dir = tmp_path / "run"
    command = [
        sys.executable,
        "recipes/eval_opt_math.py",
        "--config",
        "recipes/configs/toy.yaml",
        "--policy_sharing",
        "isolated",
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "3",
        "--save_steps",
        "3",
        "--per_device_train_batch_size",
        "8",
        "--num_generations",
        "4",
    ]
    result = run_offline(command, cwd=ROOT)

    saved = json.loads((output_dir / "multiagent_config.json").read_text())
    assert saved["base_model"] == "toy"
    assert saved["workflow"] == {  # the toy preset: the requests the toy model was trained on
        "workflow": "EvalOpt",
        "import_path": "trl_multiagent.workflows.eval_opt:EvalOpt",
        "max_iterations": 3,
        "task": "math",
        "history": "fresh",
        "parsing": "robust",
        "prompts": "guarded",
    }
    assert (output_dir / "training_summary.png").is_file()
    assert "workflow/success" in result.stdout and "role/<role>/..." in result.stdout
    state = json.loads((output_dir / "checkpoint-3" / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    torch.manual_seed(0)
    trained = load_policy(str(output_dir), "eval_opt")
    assert sorted(trained.role_to_adapter.values()) == ["evaluator", "generator"]
    episodes = run_toy(trained, held_out_dataset(30).to_list(), "math", temperature=0.7, seed=0)
    rates = format_rates(trained.workflow, episodes)
    assert all(rate >= 0.9 for rate in rates.values()), rates


@pytest.mark.slow
@needs_sandbox
def test_toy_code_preset_trains_with_the_sandbox_in_the_loop(tmp_path):
    """Two steps of the toy code preset as a user launches it: programs graded in the sandbox, some of them pass."""
    output_dir = tmp_path / "run"
    command = [
        sys.executable,
        "recipes/eval_opt_code.py",
        "--config",
        "recipes/configs/toy_code.yaml",
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "16",
        "--num_generations",
        "4",
    ]
    run_offline(command, cwd=ROOT)
    saved = json.loads((output_dir / "multiagent_config.json").read_text())
    assert saved["workflow"] == {
        "workflow": "EvalOpt",
        "import_path": "trl_multiagent.workflows.eval_opt:EvalOpt",
        "max_iterations": 2,
        "task": "code",
        "history": "fresh",
        "parsing": "robust",
        "prompts": "guarded",
    }
    state = json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "rewards/code_reward/mean" in entry]
    assert len(steps) == 2
    assert any(entry["rewards/code_reward/mean"] > 0 for entry in steps)  # the sandbox passed some programs
    assert all(entry["role/generator/unparseable"] <= 0.05 for entry in steps)  # programs in ```python blocks
    assert all(math.isfinite(entry["loss"]) for entry in steps)
