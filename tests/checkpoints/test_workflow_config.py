"""A workflow a checkpoint could not save or rebuild fails when the trainer is built, naming the attribute and the fix;
a user's workflow round-trips through save and load by its class's import path."""

from __future__ import annotations

import json
import logging
import threading

import httpx
import pytest
from tiny import tiny_config, tiny_lora, tiny_trainer
from user_workflows import DraftCritic

from trl_multiagent import MultiAgentGRPOTrainer
from trl_multiagent.checkpoints import check_workflow_config, load_trained_workflow, workflow_from_config
from trl_multiagent.checkpoints.workflow_config import workflow_config
from trl_multiagent.workflows import Voting


class AsksAService(DraftCritic):
    """Holds a client object in a public attribute: JSON cannot save it."""

    def __init__(self, base_url: str = "http://localhost:8000", rewrites: int = 1) -> None:
        super().__init__(rewrites)
        self.client = httpx.Client(base_url=base_url)


class HoldsALock(DraftCritic):
    def __init__(self, rewrites: int = 1) -> None:
        super().__init__(rewrites)
        self.lock = threading.Lock()


class DerivesAnAttribute(DraftCritic):
    """A public attribute that is not a constructor parameter: saved, but the class cannot take it back."""

    def __init__(self, rewrites: int = 1) -> None:
        super().__init__(rewrites)
        self.calls_per_episode = 1 + 2 * rewrites


class TransformsItsParameter(DraftCritic):
    """Stores its parameter changed: rebuilt from the saved value, it would be another workflow."""

    def __init__(self, rewrites: int = 1) -> None:
        super().__init__(rewrites + 1)


class KeepsItsClientPrivate(DraftCritic):
    """The fix the error names: the client private, built from a parameter JSON can save."""

    def __init__(self, base_url: str = "http://localhost:8000", rewrites: int = 1) -> None:
        super().__init__(rewrites)
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url)


@pytest.mark.parametrize(
    ("workflow", "attribute", "kind"),
    [(AsksAService(), "client", "Client"), (HoldsALock(), "lock", "lock")],
    ids=["httpx_client", "lock"],
)
def test_a_workflow_holding_an_object_json_cannot_save_fails_when_the_trainer_is_built(
    workflow, attribute, kind, tmp_path
):
    # A model name no one can load: the check comes before any model work, so its error is the one raised.
    with pytest.raises(ValueError) as raised:
        MultiAgentGRPOTrainer(
            model="no/such-model",
            workflow=workflow,
            args=tiny_config(tmp_path),
            peft_config=tiny_lora(),
            reward_funcs=[],
        )
    message = str(raised.value)
    assert f"{type(workflow).__name__}.{attribute} ({kind})" in message
    assert f"self._{attribute}" in message and "config_dict()" in message


def test_a_workflow_its_class_cannot_rebuild_is_named_with_its_attribute():
    with pytest.raises(ValueError, match=r"\['calls_per_episode'\] are not parameters of DerivesAnAttribute\(\)"):
        check_workflow_config(DerivesAnAttribute())
    with pytest.raises(ValueError, match=r"not the same workflow \(rewrites: 2 -> 3\)"):
        check_workflow_config(TransformsItsParameter())


def test_the_fix_the_error_names_passes():
    check_workflow_config(KeepsItsClientPrivate("http://example.test"))
    rebuilt = workflow_from_config(workflow_config(KeepsItsClientPrivate("http://example.test")))
    assert rebuilt.base_url == "http://example.test" and isinstance(rebuilt._client, httpx.Client)


def test_a_user_workflow_round_trips_through_save_and_load_by_its_import_path(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(tiny_model_dir, tmp_path, DraftCritic(rewrites=2), policy_sharing="isolated")
    trainer.save_model(str(tmp_path))
    saved = json.loads((tmp_path / "multiagent_config.json").read_text())["workflow"]
    assert saved == {"workflow": "DraftCritic", "import_path": "user_workflows:DraftCritic", "rewrites": 2}

    loaded = load_trained_workflow(tmp_path)
    assert type(loaded.workflow) is DraftCritic and loaded.workflow.rewrites == 2
    assert loaded.role_to_adapter == {"drafter": "drafter", "critic": "critic"}


def test_a_saved_path_is_only_called_when_it_names_a_workflow_class():
    with pytest.raises(ValueError, match="not a Workflow subclass"):
        workflow_from_config({"workflow": "run", "import_path": "subprocess:run", "args": "true"})
    with pytest.raises(ValueError, match=r"cannot be imported here.*workflow=YourWorkflow"):
        workflow_from_config({"workflow": "Gone", "import_path": "no_such_module:Gone"})
    # Records saved before the import path was: the built-in workflows by name, as before.
    assert workflow_from_config({"workflow": "Voting", "n_voters": 2, "prompts": "paper"}).n_voters == 2
    assert workflow_config(Voting())["import_path"] == "trl_multiagent.workflows.voting:Voting"


def test_a_class_that_cannot_be_imported_by_path_warns_and_asks_for_it_when_loading(caplog):
    class DefinedInAFunction(DraftCritic):
        pass

    with caplog.at_level(logging.WARNING, logger="trl_multiagent.checkpoints.workflow_config"):
        check_workflow_config(DefinedInAFunction())
    assert "cannot be imported by its path" in caplog.text and "workflow=DefinedInAFunction(...)" in caplog.text
    with pytest.raises(ValueError, match="workflow=YourWorkflow"):
        workflow_from_config(workflow_config(DefinedInAFunction()))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.checkpoints.workflow_config"):
        check_workflow_config(DraftCritic())  # importable: nothing to say
    assert caplog.text == ""
