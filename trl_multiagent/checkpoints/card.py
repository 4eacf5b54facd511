"""The multi-agent part of a run's model card: what was trained, how well, and how to load it."""

from __future__ import annotations

from typing import Any


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


def model_card_section(config: dict[str, Any], metrics: dict[str, float], repo_id: str | None) -> str:
    """Markdown appended to TRL's model card; ``config`` is ``MultiAgentGRPOTrainer.multiagent_config()``."""
    workflow = dict(config["workflow"])
    name = workflow.pop("workflow")
    parameters = ", ".join(f"{k}={v!r}" for k, v in workflow.items())
    roles = "\n".join(f"| `{role}` | `{adapter}/` |" for role, adapter in config["role_to_adapter"].items())
    results = "\n".join(f"| `{k}` | {v:.4g} |" for k, v in metrics.items()) or "| (none logged) | |"
    source = repo_id or "path/to/this/folder"
    return f"""
## Multi-agent workflow

Trained with [trl-multiagent](https://github.com/) `MultiAgentGRPOTrainer`: every role of the workflow learned from
one outcome reward.

- Base model: `{config["base_model"]}`
- Workflow: `{name}({parameters})`
- Policy sharing: `{config["policy_sharing"]}`

| role | adapter folder |
| --- | --- |
{roles}

Final logged metrics:

| metric | value |
| --- | --- |
{results}

Load the workflow with its adapters (each folder also loads with
`PeftModel.from_pretrained(base, "<folder>", adapter_name="<adapter>")`):

```python
from huggingface_hub import snapshot_download
from trl_multiagent.checkpoints import load_trained_workflow, make_generation_config, run_episodes

trained = load_trained_workflow(snapshot_download("{source}"))  # or a local folder
episodes = run_episodes(trained, [[{{"role": "user", "content": "What is 2 + 3?"}}]],
                        make_generation_config(trained, max_new_tokens=512))
print(episodes[0].final_answer)
```
"""
