"""Model cards: the run folder's and each adapter folder's README parse as Hub cards and carry the metadata."""

from __future__ import annotations

from huggingface_hub import ModelCard
from peft import LoraConfig
from scripted import addition_dataset, boxed_answer_reward

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting
from trl_multiagent.checkpoints.card import final_metrics, write_adapter_cards, write_model_cards


class WiredTrainer(MultiAgentGRPOTrainer):
    """The trainer with the card writers wired in as proposed for MultiAgentGRPOTrainer itself."""

    def _save(self, output_dir=None, state_dict=None):
        super()._save(output_dir, state_dict)
        if self.args.should_save:  # every checkpoint and the final folder: run card + one card per adapter folder
            metrics, config = final_metrics(self.state.log_history), self._checkpoints.run_config(self.model)
            write_model_cards(output_dir or self.args.output_dir, config, metrics, self.hub_model_id)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        if self.is_world_process_zero():  # replaces TRL's card (library_name transformers) with ours
            metrics = final_metrics(self.state.log_history)
            config = self._checkpoints.run_config(self.model)
            write_model_cards(self.args.output_dir, config, metrics, self.hub_model_id, dataset_name, tags)


def test_run_and_adapter_cards_parse_with_the_metadata(tiny_model_dir, tmp_path):
    trainer = WiredTrainer(
        model=tiny_model_dir,
        workflow=Voting(),
        reward_funcs=boxed_answer_reward,
        args=MultiAgentGRPOConfig(
            output_dir=str(tmp_path / "run"),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            max_steps=1,
            logging_steps=1,
            report_to="none",
            save_strategy="steps",
            save_steps=1,
            policy_sharing="isolated",
            training_summary=False,
        ),
        train_dataset=addition_dataset(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
    )
    trainer.hub_model_id = "me/voting-toy"
    trainer.train()
    run = tmp_path / "run"
    trainer.save_model(str(run))
    trainer.create_model_card(dataset_name="arithmetic")  # as push_to_hub does
    metrics = final_metrics(trainer.state.log_history)
    for adapter in ("generator", "aggregator"):  # the checkpoint folder has the cards too
        assert ModelCard.load(run / "checkpoint-1" / adapter / "README.md").data.library_name == "peft"
    assert ModelCard.load(run / "checkpoint-1" / "README.md").data.base_model == tiny_model_dir

    card = ModelCard.load(run / "README.md")
    assert card.data.base_model == tiny_model_dir and card.data.library_name == "peft"
    assert {"trl-multiagent", "Voting", "policy-sharing-isolated"} <= set(card.data.tags)
    (result,) = card.data.eval_results  # the model-index entry
    assert (result.metric_type, result.metric_value) == ("success", metrics["workflow/success"])
    assert (result.dataset_name, result.task_type) == ("arithmetic", "text-generation")
    assert card.data.to_dict()["model-index"][0]["name"] == "me/voting-toy"
    for fact in (
        "`Voting(task='math', prompts='paper', parsing='reference', n_voters=3)`",
        "Policy sharing: `isolated`",
        "| `aggregator` | `aggregator/` |",
        'snapshot_download("me/voting-toy")',
        'subfolder="generator"',
        "workflow/success",
    ):
        assert fact in card.text, fact
    assert "github.com/)" not in card.content and "](https://github.com/" not in card.content  # no placeholder link

    for adapter, role in (("generator", "generator"), ("aggregator", "aggregator")):
        adapter_card = ModelCard.load(run / adapter / "README.md")
        assert adapter_card.data.base_model == tiny_model_dir and adapter_card.data.library_name == "peft"
        assert f"role-{role}" in adapter_card.data.tags
        assert f'PeftModel.from_pretrained(base, "me/voting-toy", subfolder="{adapter}"' in adapter_card.text


def test_shared_adapter_card_names_every_role_it_plays(tmp_path):
    config = {
        "base_model": "Qwen/Qwen3-1.7B",
        "workflow": {"workflow": "EvalOpt", "max_iterations": 3, "task": "math"},
        "policy_sharing": "shared",
        "role_to_adapter": {"generator": "shared", "evaluator": "shared"},
        "adapters": ["shared"],
    }
    (tmp_path / "shared").mkdir()
    write_adapter_cards(str(tmp_path), config)
    card = ModelCard.load(tmp_path / "shared" / "README.md")
    assert {"role-generator", "role-evaluator"} <= set(card.data.tags)
    assert "the `generator`, `evaluator` roles of `EvalOpt(max_iterations=3, task='math')`" in card.text
