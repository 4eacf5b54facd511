"""A checkpoint folder rebuilds the trained workflow and reproduces the trainer's greedy outputs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from scripted import addition_dataset
from tiny import tiny_trainer
from transformers import GenerationConfig

from trl_multiagent import EvalOpt, Voting
from trl_multiagent.checkpoints import load_base_workflow, load_trained_workflow
from trl_multiagent.checkpoints.load import workflow_from_config
from trl_multiagent.evaluation import make_generation_config, run_episodes
from trl_multiagent.rollout.backends.transformers_backend import TransformersBackend
from trl_multiagent.rollout.engine import RolloutEngine


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("voting-run")
    settings = dict(max_steps=2, save_steps=2, learning_rate=5e-2, policy_sharing="isolated", seed=3)
    trainer = tiny_trainer(tiny_model_dir, output_dir, **settings)
    trainer.train()
    return trainer, output_dir / "checkpoint-2"


def trainer_greedy(trainer, prompts):
    """Greedy episodes from the trainer's own model, routing and workflow (its sampling turned off)."""
    config = GenerationConfig(**{**trainer.generation_kwargs, "do_sample": False}, disable_compile=True)
    backend = TransformersBackend(
        trainer._unwrapped_for_generation,
        trainer._text_tokenizer,
        trainer._updates.installed.router,
        config,
        trainer.eos_token_ids,
    )
    return RolloutEngine(trainer.workflow, backend, trainer.role_adapters).run(prompts)


def greedy(loaded):
    return make_generation_config(loaded, max_new_tokens=8)


def calls(episodes):
    return [[(c.role, c.instance, c.adapter, c.completion_ids) for c in e.calls] for e in episodes]


def test_checkpoint_reproduces_greedy_outputs(trained):
    trainer, checkpoint = trained
    loaded = load_trained_workflow(checkpoint)
    assert loaded.workflow.config_dict() == trainer.workflow.config_dict()
    assert loaded.role_to_adapter == {"generator": "generator", "aggregator": "aggregator"}
    assert set(loaded.model.peft_config) == {"generator", "aggregator"}
    moved = {n: p for n, p in trainer.model.named_parameters() if "lora_B" in n}
    reloaded = dict(loaded.model.named_parameters())
    assert all(torch.equal(p, reloaded[n]) for n, p in moved.items())
    assert any(p.abs().sum() > 0 for p in moved.values())  # the adapters trained away from their zero init

    prompts = [row["prompt"] for row in addition_dataset(5)]
    expected = trainer_greedy(trainer, prompts)
    actual = run_episodes(loaded, prompts, greedy(loaded))
    assert calls(actual) == calls(expected)
    assert [e.final_answer for e in actual] == [e.final_answer for e in expected]
    base = run_episodes(load_base_workflow(loaded.config["base_model"], Voting()), prompts, greedy(loaded))
    assert [e.final_answer for e in base] != [e.final_answer for e in expected]  # so the match above is no accident


def test_unknown_workflow_asks_for_it_explicitly(trained, tmp_path):
    _, checkpoint = trained
    copy = shutil.copytree(checkpoint, tmp_path / "checkpoint")
    config = json.loads((copy / "multiagent_config.json").read_text())
    config["workflow"] = {"workflow": "MyVoting", "n_voters": 3}
    (copy / "multiagent_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="workflow="):
        load_trained_workflow(copy)
    assert load_trained_workflow(copy, workflow=Voting(n_voters=2)).workflow.n_voters == 2


def test_roles_without_an_adapter_are_named(trained):
    _, checkpoint = trained
    with pytest.raises(ValueError, match=r"\['evaluator'\]"):
        load_trained_workflow(checkpoint, workflow=EvalOpt())
    rerouted = load_trained_workflow(
        checkpoint, workflow=EvalOpt(), role_to_adapter={"generator": "generator", "evaluator": "aggregator"}
    )
    assert set(rerouted.model.peft_config) == {"generator", "aggregator"}


@pytest.mark.parametrize(
    ("saved", "parsing"),
    [
        ({"workflow": "Voting", "n_voters": 3, "task": "math", "prompts": "paper"}, "robust"),  # saved before rules
        ({"workflow": "EvalOpt", "max_iterations": 2, "task": "math", "history": "fresh"}, "robust"),
        ({"workflow": "OrchWorkers", "n_workers": 3, "prompts": "paper", "parsing": "reference"}, "reference"),
    ],
)
def test_saved_workflows_keep_the_readers_they_ran_with(saved, parsing):
    """A checkpoint saved before the readers were a setting was read by the last box ("robust"): it rebuilds so."""
    assert workflow_from_config(saved).parsing == parsing
