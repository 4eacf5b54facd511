"""TRL's model flags (`ModelConfig`'s `--dtype`, `--attn_implementation`, `--model_revision`, the `GRPOConfig`'s
`--trust_remote_code`, `--load_in_4bit` / `--load_in_8bit` and the `bnb_4bit_*` fields) reach the model a recipe
trains, and every base of `role_models`, as in TRL's own `trl grpo`; k-bit quantization is refused, naming why, where
bitsandbytes cannot run (this machine has no CUDA GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from presets import recipe_trainer_kwargs
from transformers import AutoModelForCausalLM

from trl_multiagent import Voting
from trl_multiagent.cli.recipe_run import RecipeRun
from trl_multiagent.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "recipes" / "configs"
WORKFLOWS, TASKS = ("eval_opt", "voting", "orch_workers", "single_agent"), ("math", "code")
TRAINING_RECIPES = [f"{workflow}_{task}" for workflow in WORKFLOWS for task in TASKS]


def built_trainer(model: str, tmp_path, *flags: str, role_base: str | None = None):
    """The trainer `recipes/voting_math.py` builds on the CPU preset with ``flags``: the body every recipe runs."""
    argv = ["recipes/voting_math.py", "--config", str(PRESETS / "cpu.yaml"), "--model_name_or_path", model]
    argv += ["--output_dir", str(tmp_path / "run"), "--max_completion_length", "8", *flags]
    if role_base is not None:
        argv += ["--role_models", json.dumps({"aggregator": role_base})]
    run = RecipeRun.parse(paper_preset=PRESETS / "paper_math.yaml", cpu_preset=PRESETS / "cpu.yaml", argv=argv)
    return run.trainer(Voting(), get_task("math"))


def loaded_models(trainer) -> list[torch.nn.Module]:
    """The trainer's base model and each extra base's, as loaded."""
    return [trainer.model.get_base_model(), *(base.model.get_base_model() for base in trainer.bases.extra.values())]


@pytest.mark.parametrize("recipe", [*TRAINING_RECIPES, "train"])
def test_every_recipe_passes_the_model_flags_on(recipe):
    """What each recipe hands its trainer: the loading arguments TRL's script builds, and its quantization config."""
    flags = ["--dtype", "bfloat16", "--attn_implementation", "eager", "--model_revision", "v2", "--load_in_4bit"]
    flags += ["true", "--bnb_4bit_quant_type", "fp4", "--use_bnb_nested_quant", "true", "--trust_remote_code", "true"]
    offline = "toy_code" if recipe.endswith("_code") else "arithmetic"
    kwargs = recipe_trainer_kwargs(
        recipe, "--config", "toy", "--output_dir", "unused", "--dataset_name", offline, *flags
    )
    loading = kwargs["args"].model_init_kwargs
    assert loading == {
        "revision": "v2",
        "trust_remote_code": True,
        "attn_implementation": "eager",
        "dtype": "bfloat16",
    }
    quantization = kwargs["quantization_config"]
    assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "fp4"
    assert quantization.bnb_4bit_use_double_quant and quantization.bnb_4bit_compute_dtype == torch.bfloat16


def test_model_init_kwargs_set_in_a_config_win_over_the_flags(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("base: toy\nmodel_init_kwargs: {dtype: float16, low_cpu_mem_usage: true}\n")
    kwargs = recipe_trainer_kwargs("voting_math", "--config", str(config), "--dtype", "bfloat16")
    assert kwargs["args"].model_init_kwargs["dtype"] == "float16"
    assert kwargs["args"].model_init_kwargs["low_cpu_mem_usage"] is True


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_loads_the_model_and_every_role_base_in_it(tiny_model_dir, tiny_judge_dir, tmp_path, dtype):
    trainer = built_trainer(tiny_model_dir, tmp_path, "--dtype", dtype, role_base=tiny_judge_dir)
    models = loaded_models(trainer)
    assert len(models) == 2
    assert [model.dtype for model in models] == [getattr(torch, dtype)] * 2


def test_without_dtype_the_model_loads_in_float32_as_in_trl(tiny_model_dir, tmp_path):
    (model,) = loaded_models(built_trainer(tiny_model_dir, tmp_path))
    assert model.dtype == torch.float32


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_attn_implementation_reaches_the_model_and_every_role_base(
    tiny_model_dir, tiny_judge_dir, tmp_path, attention
):
    trainer = built_trainer(tiny_model_dir, tmp_path, "--attn_implementation", attention, role_base=tiny_judge_dir)
    assert [model.config._attn_implementation for model in loaded_models(trainer)] == [attention, attention]


def hub_repo(cache: Path, repo_id: str, revisions: dict[str, str]) -> None:
    """Put ``repo_id`` in the Hub cache ``cache``: each revision (a branch name) -> a saved model folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for i, (revision, folder) in enumerate(revisions.items()):
        commit = f"{i + 1:040x}"
        shutil.copytree(folder, repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)


def doubled_embeddings(model_dir: str, folder: Path) -> torch.Tensor:
    """Save ``model_dir``'s model with its input embeddings doubled, and its tokenizer, to ``folder``."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)
    model.save_pretrained(folder)
    for name in Path(model_dir).iterdir():
        if name.name.startswith("tokenizer") or name.suffix == ".jinja":
            shutil.copy(name, folder / name.name)
    return model.model.embed_tokens.weight.detach()


def test_model_revision_loads_the_model_and_every_role_base_at_that_revision(
    tiny_model_dir, tiny_judge_dir, tmp_path, monkeypatch
):
    """Hub ids at `--model_revision v2` load v2's weights, not the default branch's, for the trainer's
    model and for a `role_models` base (served offline from a Hub cache of our own)."""
    cache = tmp_path / "hub"
    v2 = {
        "model": doubled_embeddings(tiny_model_dir, tmp_path / "v2"),
        "judge": doubled_embeddings(tiny_judge_dir, tmp_path / "judge-v2"),
    }
    hub_repo(cache, "tiny-org/model", {"main": tiny_model_dir, "v2": str(tmp_path / "v2")})
    hub_repo(cache, "tiny-org/judge", {"main": tiny_judge_dir, "v2": str(tmp_path / "judge-v2")})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    def embeddings(*flags: str) -> list[torch.Tensor]:
        trainer = built_trainer("tiny-org/model", tmp_path / str(flags), *flags, role_base="tiny-org/judge")
        return [model.model.embed_tokens.weight.detach() for model in loaded_models(trainer)]

    default, main, at_v2 = embeddings(), embeddings("--model_revision", "main"), embeddings("--model_revision", "v2")
    for i, name in enumerate(("model", "judge")):  # the trainer's model, then the role base
        assert torch.equal(default[i], main[i])
        assert torch.equal(at_v2[i], v2[name]) and not torch.equal(at_v2[i], main[i])


def custom_code_model(model_dir: str, folder: Path) -> str:
    """``model_dir`` whose config maps AutoModelForCausalLM to a class in the folder's own code."""
    shutil.copytree(model_dir, folder)
    (folder / "own_model.py").write_text(
        "from transformers import Qwen3ForCausalLM\n\n\nclass OwnQwen3(Qwen3ForCausalLM):\n    pass\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(auto_map={"AutoModelForCausalLM": "own_model.OwnQwen3"}, architectures=["OwnQwen3"])
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_trust_remote_code_loads_the_models_own_code_for_every_base(tiny_model_dir, tiny_judge_dir, tmp_path):
    main = custom_code_model(tiny_model_dir, tmp_path / "main")
    other = custom_code_model(tiny_judge_dir, tmp_path / "other")
    trainer = built_trainer(main, tmp_path, "--trust_remote_code", "true", role_base=other)
    assert [type(model).__name__ for model in loaded_models(trainer)] == ["OwnQwen3", "OwnQwen3"]


@pytest.mark.parametrize("flag, bits", [("--load_in_4bit", 4), ("--load_in_8bit", 8)])
def test_kbit_quantization_without_a_cuda_gpu_is_refused_naming_why(tiny_model_dir, tmp_path, flag, bits):
    assert not torch.cuda.is_available()
    with pytest.raises(ValueError, match=rf"--load_in_{bits}bit .* bitsandbytes \(QLoRA\).*CUDA GPU; this machine"):
        built_trainer(tiny_model_dir, tmp_path, flag, "true")


def test_kbit_quantization_without_bitsandbytes_is_refused_naming_the_install(tiny_model_dir, tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "bitsandbytes" else find_spec(name))
    with pytest.raises(ValueError, match=r"\(QLoRA\), which is not installed: `pip install bitsandbytes`"):
        built_trainer(tiny_model_dir, tmp_path, "--load_in_4bit", "true")
