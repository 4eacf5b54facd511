"""Model cards of a saved run: the run folder's card and one card per role adapter folder, with Hub metadata.

The run card (``README.md`` of the run folder) carries ``base_model``, ``library_name: peft``, tags, and a
model-index entry with the workflow's success; its text names the workflow, the roles and their adapter folders,
the policy sharing, the final metrics and how to load it. Each adapter folder gets its own card, so a user of
``PeftModel.from_pretrained(base, repo, subfolder=adapter)`` sees which roles that adapter plays and in what workflow.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .workflow_config import IMPORT_PATH

TAGS = ["trl", "trl-multiagent", "grpo", "multi-agent", "lora"]


def final_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The last logged value of the outcome and per-role headline metrics."""
    keys = ("workflow/success", "reward")
    found: dict[str, float] = {}
    for entry in log_history:
        for key, value in entry.items():
            if isinstance(value, int | float) and (key in keys or key.endswith("/completion_length")):
                found[key] = float(value)
        if "step" in entry and found:
            found["step"] = float(entry["step"])
    return found


def _workflow_call(config: dict[str, Any]) -> str:
    workflow = dict(config["workflow"])
    name = workflow.pop("workflow")
    workflow.pop(IMPORT_PATH, None)  # where the class is, not one of its parameters
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in workflow.items())})"


def _versions() -> str:
    found = []
    for package in ("trl-multiagent", "trl", "transformers", "peft", "torch"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def model_card_section(config: dict[str, Any], metrics: dict[str, float], repo_id: str | None) -> str:
    """The run card's markdown body; ``config`` is ``MultiAgentGRPOTrainer.multiagent_config()``."""
    on_base = config.get("adapter_models", {})
    roles = "\n".join(
        f"| `{role}` | `{adapter}/` | `{on_base.get(adapter, config['base_model'])}` |"
        for role, adapter in config["role_to_adapter"].items()
    )
    results = "\n".join(f"| `{k}` | {v:.4g} |" for k, v in metrics.items()) or "| (none logged) | |"
    source = f'snapshot_download("{repo_id}")' if repo_id else '"path/to/this/folder"'
    adapter = config["adapters"][0]
    subfolder = f'"{repo_id}", subfolder="{adapter}"' if repo_id else f'"path/to/this/folder/{adapter}"'
    return f"""
## Multi-agent workflow

Trained with trl-multiagent's `MultiAgentGRPOTrainer` (not on PyPI yet: `pip install -e .` in a clone of its
repository): every role of the workflow learned from one outcome reward, with GRPO over whole workflow episodes.

- Base model: `{config["base_model"]}`
- Workflow: `{_workflow_call(config)}`
- Policy sharing: `{config["policy_sharing"]}`

| role | adapter folder | base model |
| --- | --- | --- |
{roles}

Final logged metrics:

| metric | value |
| --- | --- |
{results}

Run the trained workflow, every role with its adapter:

```python
from huggingface_hub import snapshot_download
from trl_multiagent.checkpoints import load_trained_workflow
from trl_multiagent.evaluation import make_generation_config, run_episodes

trained = load_trained_workflow({source})
episodes = run_episodes(trained, [[{{"role": "user", "content": "What is 2 + 3?"}}]],
                        make_generation_config(trained, max_new_tokens=512))
print(episodes[0].final_answer)
```

Or one role's adapter alone, with PEFT:

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("{on_base.get(adapter, config["base_model"])}")
model = PeftModel.from_pretrained(base, {subfolder})
```

Framework versions: {_versions()}.
"""


def run_card(
    config: dict[str, Any],
    metrics: dict[str, float],
    repo_id: str | None = None,
    dataset_name: str | None = None,
    tags: list[str] | None = None,
) -> ModelCard:
    """The run folder's card, with ``base_model``, ``library_name: peft`` and the workflow's success as model-index."""
    workflow = config["workflow"]["workflow"]
    eval_results = None
    if "workflow/success" in metrics:
        eval_results = [
            EvalResult(
                task_type="text-generation",
                dataset_type=dataset_name or "custom",
                dataset_name=dataset_name or "training prompts",
                dataset_split="train",
                metric_type="success",
                metric_name=f"{workflow} success (last training step)",
                metric_value=metrics["workflow/success"],
            )
        ]
    data = ModelCardData(
        base_model=config["base_model"],
        library_name="peft",
        pipeline_tag="text-generation",
        tags=[*TAGS, workflow, f"policy-sharing-{config['policy_sharing']}", *(tags or [])],
        datasets=[dataset_name] if dataset_name else None,
        model_name=repo_id or f"{workflow}-{config['policy_sharing']}",
        eval_results=eval_results,
    )
    title = f"# {repo_id or workflow + ' roles'}: {workflow} trained end to end\n"
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{title}{model_card_section(config, metrics, repo_id)}")


def adapter_card(config: dict[str, Any], adapter: str, repo_id: str | None = None) -> ModelCard:
    """The card of one adapter folder: which roles of which workflow it plays, and how to load it alone."""
    roles = [role for role, name in config["role_to_adapter"].items() if name == adapter]
    workflow = config["workflow"]["workflow"]
    base = config.get("adapter_models", {}).get(adapter, config["base_model"])  # its own base under role_models
    data = ModelCardData(
        base_model=base,
        library_name="peft",
        pipeline_tag="text-generation",
        tags=[*TAGS, workflow, *(f"role-{role}" for role in roles)],
    )
    where = f'"{repo_id}", subfolder="{adapter}"' if repo_id else f'"path/to/run/{adapter}"'
    played = ", ".join(f"`{role}`" for role in roles)
    text = f"""
# Adapter `{adapter}`: the {played} role{"s" if len(roles) > 1 else ""} of `{_workflow_call(config)}`

A LoRA adapter of `{base}` trained with trl-multiagent (policy sharing `{config["policy_sharing"]}`).
In the workflow it answers every call of: {played}. The other roles' adapters are this folder's siblings; the
parent folder's card and `multiagent_config.json` describe the whole run.

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("{base}")
model = PeftModel.from_pretrained(base, {where}, adapter_name="{adapter}")
```

Prompts must be the ones the workflow sends this role (`trl_multiagent.workflows`): run the whole workflow with
`trl_multiagent.checkpoints.load_trained_workflow` on the parent folder.
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{text}")


def write_model_cards(
    output_dir: str,
    config: dict[str, Any],
    metrics: dict[str, float],
    repo_id: str | None = None,
    dataset_name: str | None = None,
    tags: list[str] | None = None,
) -> None:
    """``README.md`` of the run folder, and of every adapter folder present in it."""
    run_card(config, metrics, repo_id, dataset_name, tags).save(os.path.join(output_dir, "README.md"))
    write_adapter_cards(output_dir, config, repo_id)


def write_adapter_cards(output_dir: str, config: dict[str, Any], repo_id: str | None = None) -> None:
    """``README.md`` in every adapter folder of ``output_dir`` (a run folder or one of its checkpoints)."""
    for adapter in config["adapters"]:
        folder = os.path.join(output_dir, adapter)
        if os.path.isdir(folder):
            adapter_card(config, adapter, repo_id).save(os.path.join(folder, "README.md"))
