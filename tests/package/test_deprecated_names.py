"""Deprecations, not breaks: every public name that moved or became private since 0.1.0 still works, warning once
per use with a ``DeprecationWarning`` that names what replaces it and the release that removes it."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import warnings
from operator import attrgetter
from pathlib import Path

import pytest
from scripted import addition_dataset, boxed_answer_reward
from tiny import random_answers, tiny_config, tiny_lora, tiny_trainer

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer
from trl_multiagent.common.deprecation import MOVED, REMOVED_IN
from trl_multiagent.common.moved_modules import MOVED_MODULES
from trl_multiagent.rollout.backends.from_config import BackendContext
from trl_multiagent.trainer.renamed_hooks import ADAPTER_PARTS, RENAMED_ATTRIBUTES, RENAMED_METHODS

MOVED_NAMES = [(module, old, new) for module, moved in MOVED.items() for old, new in moved.items()]


def replacement_and_target(new: str | tuple[str, str]) -> tuple[str, str]:
    return new if isinstance(new, tuple) else (new, new)


def renamed(old: str, new: str) -> str:
    return re.escape(f"`MultiAgentGRPOTrainer.{old}` is deprecated; use `MultiAgentGRPOTrainer.{new}`, now private")


def resolve(dotted: str):
    where, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(where), name)


@pytest.mark.parametrize("module, old, new", MOVED_NAMES, ids=[f"{m}.{o}" for m, o, _ in MOVED_NAMES])
def test_a_moved_name_is_the_new_one_with_a_warning(module, old, new):
    replacement, target = replacement_and_target(new)
    expected = f"`{module}.{old}` is deprecated; use `{replacement}` instead. It will be removed in trl-multiagent "
    expected += f"{REMOVED_IN}."
    with pytest.warns(DeprecationWarning, match=re.escape(expected)):
        value = getattr(importlib.import_module(module), old)
    assert value is resolve(target)


@pytest.mark.parametrize("old, new", MOVED_MODULES.items())
def test_a_moved_module_is_the_new_one_with_a_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported by an earlier test: import it afresh
    expected = f"`module {old}` is deprecated; use `{new}` instead. It will be removed in trl-multiagent {REMOVED_IN}."
    with pytest.warns(DeprecationWarning, match=re.escape(expected)):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new and module.__spec__.origin == module.__file__  # still itself


def test_an_old_module_path_warns_at_the_import_line():
    """`from trl_multiagent.recipe_parser import RecipeParser`, as the recipes of 0.1.0 wrote it: one warning, at the
    recipe's line, and the same class as at its new path."""
    recipe = "from trl_multiagent.recipe_parser import RecipeParser\n"
    namespace = {"__name__": "__main__"}
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.delitem(sys.modules, "trl_multiagent.recipe_parser", raising=False)
        warnings.simplefilter("always")
        exec(compile(recipe, "eval_opt_math.py", "exec"), namespace)
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(DeprecationWarning, "eval_opt_math.py", 1)]
    from trl_multiagent.cli.recipe_parser import RecipeParser

    assert namespace["RecipeParser"] is RecipeParser


def test_the_repositorys_own_code_imports_no_moved_module_path():
    """The package, its recipes, scripts and benchmarks import the new paths: a user running them sees no warning
    that names our own code."""
    root = Path(__file__).resolve().parents[2]
    old_paths = []
    for folder in ("trl_multiagent", "recipes", "scripts", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                old_paths += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if n in MOVED_MODULES]
    assert old_paths == []


def test_the_packages_that_kept_their_names_import_without_a_warning():
    """`trl_multiagent.trainer`, `.config` and `.cli` became folders of the same name: what users import from them
    (the trainer, the config, the console command's `main`, and the other names of 0.1.0's modules) warns nothing."""
    code = (
        "from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer\n"
        "from trl_multiagent.config import MultiAgentGRPOConfig, POLICY_SHARINGS\n"
        "from trl_multiagent.trainer import MultiAgentGRPOTrainer\n"
        "from trl_multiagent.cli import main, COMMANDS\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(code, "user_script.py", "exec"), {"__name__": "__main__"})
    assert [str(w.message) for w in caught if "trl-multiagent" in str(w.message)] == []
    from trl_multiagent.config.multiagent_grpo_config import POLICY_SHARINGS

    assert sys.modules["trl_multiagent.config"].POLICY_SHARINGS is POLICY_SHARINGS


def test_the_old_evaluation_helpers_give_what_the_task_registry_gives():
    """0.1.0's `eval_dataset` and `task_reward`, whose replacement is called differently, through the registry."""
    from trl_multiagent.tasks import get_task

    with pytest.warns(DeprecationWarning):
        from trl_multiagent.evaluation import eval_dataset, task_reward
    assert eval_dataset("math", "arithmetic", 5)[:] == get_task("math").eval_dataset("arithmetic", 5)[:]
    assert task_reward("math") is get_task("math").make_reward()
    assert type(task_reward("code")) is type(get_task("code").make_reward())


def test_a_0_1_0_recipe_import_warns_once_at_its_own_line():
    """`from trl_multiagent.toy import resolve_model_name`, as every recipe of 0.1.0 wrote it: one warning, pointing
    at the recipe's line (the default filters show a DeprecationWarning there when the recipe is `__main__`)."""
    recipe = "from trl_multiagent.toy import resolve_model_name\nfolder = resolve_model_name('toy')\n"
    namespace = {"__name__": "__main__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(recipe, "eval_opt_math.py", "exec"), namespace)
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(DeprecationWarning, "eval_opt_math.py", 1)]
    assert namespace["folder"] == resolve("trl_multiagent.common.model_names.resolve_model_name")("toy")


@pytest.mark.parametrize("old, new", RENAMED_METHODS.items())
def test_an_old_method_name_calls_the_private_one_with_a_warning(old, new):
    class Probe(MultiAgentGRPOTrainer):
        pass

    setattr(Probe, new, lambda self, *args, **kwargs: ("called", args, kwargs))
    probe = object.__new__(Probe)  # the delegation needs no trainer state
    with pytest.warns(DeprecationWarning, match=renamed(old, new)):
        assert getattr(probe, old)(1, x=2) == ("called", (1,), {"x": 2})


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    return tiny_trainer(
        tiny_model_dir, tmp_path_factory.mktemp("deprecations"), EvalOpt(), respond=random_answers, max_steps=1
    )


@pytest.mark.parametrize("old, new", RENAMED_ATTRIBUTES.items())
def test_an_old_attribute_name_reads_the_private_one_with_a_warning(trainer, old, new):
    with pytest.warns(DeprecationWarning, match=renamed(old, new)):
        value = getattr(trainer, old)
    assert value is attrgetter(new)(trainer) or value == attrgetter(new)(trainer)


def test_old_names_that_set_state_and_those_without_a_private_twin(trainer):
    with pytest.warns(DeprecationWarning, match="micro_step"):
        trainer.micro_step = 3
    assert trainer._micro_step == 3
    trainer._micro_step = 0
    with pytest.warns(DeprecationWarning, match="read_multiagent_config"):
        config = trainer.multiagent_config()
    assert config == trainer._checkpoints.run_config(trainer.model)
    assert config["policy_sharing"] == trainer.args.policy_sharing
    with pytest.warns(DeprecationWarning, match=", ".join(f"`{part}`" for part in ADAPTER_PARTS)):
        adapters = trainer.adapters
    assert adapters.adapter_names == trainer._updates.installed.adapter_names
    assert adapters.forward_keys is not None  # from the routing part
    with pytest.raises(AttributeError, match="None of the trainer's _updates.installed"):
        adapters.no_such_part  # noqa: B018
    with pytest.warns(DeprecationWarning, match="backend_context"):
        assert isinstance(trainer.backend_context(), BackendContext)


def test_a_subclass_overriding_an_old_hook_name_is_still_called(tiny_model_dir, tmp_path):
    """0.1.0's way to extend the trainer: override `generate_and_score`, call `super().generate_and_score`. The class
    warns when it is made; training calls the override, and its `super()` call reaches the trainer's own step."""
    from scripted import ScriptedBackend
    from transformers import AutoTokenizer

    scored = []
    overrides = "OldHooks.generate_and_score overrides a hook .* `_generate_and_score`"
    with pytest.warns(DeprecationWarning, match=overrides):

        class OldHooks(MultiAgentGRPOTrainer):
            def generate_and_score(self, inputs):
                batch = super().generate_and_score(inputs)
                scored.append(len(batch))
                return batch

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = OldHooks(
        model=tiny_model_dir,
        workflow=EvalOpt(),
        reward_funcs=boxed_answer_reward,
        args=tiny_config(tmp_path, max_steps=2),
        train_dataset=addition_dataset(),
        peft_config=tiny_lora(),
        processing_class=tokenizer,
        rollout_backend=ScriptedBackend(tokenizer, random_answers, seed=0),
    )
    with pytest.warns(DeprecationWarning, match=r"`MultiAgentGRPOTrainer\.generate_and_score` is deprecated"):
        trainer.train()
    assert len(scored) == 2 and all(n > 0 for n in scored)  # one generation batch per step, through the override
