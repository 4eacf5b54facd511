"""push_to_hub uploads one folder holding every role adapter, a model card, and what rebuilds the workflow."""

from __future__ import annotations

import shutil

import transformers.trainer
from scripted import addition_dataset
from tiny import tiny_trainer

from trl_multiagent import MultiAgentGRPOTrainer
from trl_multiagent.checkpoints import load_trained_workflow
from trl_multiagent.evaluation import make_generation_config, run_episodes


class FakeHubApi:
    """Stands in for the Hub (unreachable here): records the uploaded folder by copying it."""

    def __init__(self, destination):
        self.destination = destination

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, **kwargs):
        shutil.copytree(folder_path, self.destination)
        return f"https://hub/{repo_id}"


def test_push_to_hub_folder_rebuilds_the_trained_workflow(tiny_model_dir, tmp_path, monkeypatch):
    api = FakeHubApi(tmp_path / "uploaded")
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda *a, **k: api)
    monkeypatch.setattr(MultiAgentGRPOTrainer, "init_hf_repo", lambda self, token=None: None)
    settings = dict(max_steps=2, logging_steps=1, learning_rate=5e-2, save_strategy="no", policy_sharing="isolated")
    trainer = tiny_trainer(tiny_model_dir, tmp_path / "run", hub_model_id="me/voting-toy", **settings)
    trainer.hub_model_id = "me/voting-toy"
    trainer.train()
    trainer.push_to_hub()

    uploaded = tmp_path / "uploaded"
    for role in ("generator", "aggregator"):
        assert (uploaded / role / "adapter_model.safetensors").is_file()
    card = (uploaded / "README.md").read_text()
    for fact in (
        "`Voting(task='math', prompts='paper', parsing='reference', n_voters=3)`",
        "Policy sharing: `isolated`",
        "| `aggregator` | `aggregator/` |",
        "workflow/success",
        'snapshot_download("me/voting-toy")',
        tiny_model_dir,
    ):
        assert fact in card, fact

    prompts = [row["prompt"] for row in addition_dataset(3)]
    rebuilt = load_trained_workflow(uploaded)
    greedy = make_generation_config(rebuilt, max_new_tokens=8)
    trainer.rollout_backend.generation_config = greedy  # the trainer's own model, greedy
    expected = [e.final_answer for e in trainer.engine.run(prompts)]
    assert [e.final_answer for e in run_episodes(rebuilt, prompts, greedy)] == expected
