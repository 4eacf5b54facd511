"""What README.md and the docs print runs: the README's Python example trains (on the tiny model and the DAPO sample
instead of Qwen3-1.7B and the Hub), the user workflow of docs/workflows.md trains with the library as it is, and every
file, preset and docs page the README names exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tiny import CPU_SETTINGS, tiny_trainer

import trl_multiagent.tasks

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
DAPO_FIXTURE = ROOT / "tests" / "fixtures" / "dapo_math_17k_sample.jsonl"


def marked_block(text: str, marker: str) -> str:
    return re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", text, re.S).group(1)


def docs_workflow_class():
    page = (ROOT / "docs" / "workflows.md").read_text()
    namespace: dict = {}
    exec(compile(marked_block(page, "user-workflow"), "docs/workflows.md", "exec"), namespace)
    return namespace["DraftCritiqueRewrite"]


def test_docs_workflow_trains(tiny_model_dir, tmp_path):
    workflow = docs_workflow_class()()
    settings = dict(max_steps=1, logging_steps=1, save_strategy="no", policy_sharing="isolated")
    trainer = tiny_trainer(tiny_model_dir, tmp_path, workflow, **settings)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and logs[0]["role/drafter/calls"] >= 4 and logs[0]["role/critic/calls"] == 4
    assert list(trainer.model.peft_config) == ["drafter", "critic"]


def test_readme_example_trains(tiny_model_dir, tmp_path, monkeypatch):
    """The example as printed, but for three swaps (each must still find its text): the tiny model for Qwen3-1.7B,
    the DAPO sample file for the Hub dataset, and a one-step CPU run in a temporary folder."""
    code = marked_block(README, "readme-example")
    swaps = {
        '"Qwen/Qwen3-1.7B"': repr(tiny_model_dir),
        "MultiAgentGRPOConfig(": "MultiAgentGRPOConfig(**ONE_CPU_STEP, ",
        'output_dir="runs/eval_opt"': f"output_dir={str(tmp_path)!r}",
    }
    for old, new in swaps.items():
        assert code.count(old) == 1, f"the README example no longer holds {old}: update this test's swaps"
        code = code.replace(old, new)
    real_loader = trl_multiagent.tasks.load_dapo_math
    monkeypatch.setattr(trl_multiagent.tasks, "load_dapo_math", lambda: real_loader(path_or_id=str(DAPO_FIXTURE)))
    one_step = {k: v for k, v in CPU_SETTINGS.items() if k != "num_generations"}
    namespace: dict = {
        "ONE_CPU_STEP": {**one_step, "per_device_train_batch_size": 8, "max_steps": 1, "logging_steps": 1}
    }
    exec(compile(code, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    assert list(trainer.model.peft_config) == ["generator", "evaluator"]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["role/generator/calls"] >= 8 and logs[0]["role/evaluator/calls"] >= 8


def test_readme_names_only_files_that_exist():
    named = set(
        re.findall(
            r"(?<![\w/.])((?:recipes|accelerate_configs|scripts|docs|benchmarks)/[\w/.-]+\.(?:py|yaml|md))", README
        )
    )
    for preset in re.findall(r"`(\w+\.yaml)`", README):  # the presets table names files of recipes/configs
        named.add(f"recipes/configs/{preset}" if not (ROOT / "accelerate_configs" / preset).exists() else "")
    named.discard("")
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert len(named) > 20 and not missing, missing
    shipped = {path.name for path in (ROOT / "recipes" / "configs").glob("*.yaml")}
    assert shipped <= set(re.findall(r"`(\w+\.yaml)`", README)), "a shipped preset is missing from README's table"


def test_readme_commands_run_what_ci_runs():
    """The two first commands: the toy run (the figures' command) and the test command that .ci/run runs."""
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    toy, tests = commands[0], commands[1]
    assert toy.endswith(
        "accelerate launch --config_file accelerate_configs/cpu.yaml recipes/eval_opt_math.py "
        "--config recipes/configs/toy.yaml --output_dir outputs/toy-eval-opt"
    )
    assert tests.endswith('pip install -e ".[test]" && python -m pytest -q -n auto')
    assert "\npython -m pytest -q -n auto\n" in (ROOT / ".ci" / "run").read_text()
    for command in (toy, tests):
        shlex.split(command)  # quoting as a shell reads it
