"""`trl-multiagent` as a user runs it: a subprocess at minimum size, from the shipped recipes and presets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, offline_env, run_offline

from trl_multiagent.cli.commands import main, shipped_file, train_command, vllm_serve_command

# The toy preset, cut to one tiny step (8 episodes, short completions).
TINY = ["--max_steps", "1", "--save_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4"]
TINY += ["--max_completion_length", "24"]

USER_MODULE = '''
from trl_multiagent.workflows import Workflow, last_boxed, problem_text


class UserWorkflow(Workflow):
    """A drafter answers, a critic replies; the drafter rewrites once unless the critic said 'none'."""

    roles = ("drafter", "critic")

    async def run(self, prompt, generate):
        question = problem_text(prompt)
        ask = [{"role": "user", "content": f"{question}\\nPut the final answer in \\\\boxed{{}}."}]
        draft = await generate("drafter", ask)
        critique = await generate("critic", [{"role": "user", "content": f"{question}\\nAnswer: {draft}\\nMistakes?"}])
        if critique.strip().lower() == "none" and last_boxed(draft) is not None:
            return draft
        return await generate("drafter", ask + [{"role": "assistant", "content": draft},
                                                {"role": "user", "content": f"{critique}\\nRewrite."}])


def reward(completions, answer, **kwargs):
    return [float(str(a) in (c[0]["content"] if isinstance(c, list) else c)) for c, a in zip(completions, answer)]
'''


def cli() -> list[str]:
    """The installed console script (pip install -e .), else the same entry point through the module."""
    script = shutil.which("trl-multiagent", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "trl_multiagent.cli"]


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return run_offline([*cli(), *args], cwd=tmp_path, env=env)


@pytest.mark.slow
def test_train_a_built_in_workflow_with_the_shipped_toy_preset_then_report_on_it(tmp_path):
    run(["train", "eval_opt", "--config", "toy", "--output_dir", "run", *TINY], tmp_path)
    saved = json.loads((tmp_path / "run" / "multiagent_config.json").read_text())
    assert saved["workflow"]["workflow"] == "EvalOpt" and saved["base_model"] == "toy"
    for role in ("generator", "evaluator"):
        assert (tmp_path / "run" / "checkpoint-1" / role / "adapter_model.safetensors").is_file()
    assert "Wrote run/report.html" in run(["report", "run"], tmp_path).stdout
    page = (tmp_path / "run" / "report.html").read_text()
    assert "<td>max_steps</td><td>1</td><td>-1</td>" in page  # a setting of this run, against the default
    assert "<td>workflow/success</td>" in page and 'src="data:image/png;base64,' in page


@pytest.mark.slow
def test_print_config_shows_the_merged_settings_and_trains_nothing(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: toy\nlearning_rate: 5.0e-4\n")
    printed = run(["train", "voting", "--config", "mine.yaml", "--max_steps", "3", "--print-config"], tmp_path)
    lines = printed.stdout.splitlines()
    assert "# settings: library defaults + paper_math.yaml + toy.yaml + mine.yaml + command line" in lines
    for line in ("max_steps: 3  # command line", "learning_rate: 0.0005  # mine.yaml", "lora_r: 16  # toy.yaml"):
        assert line in lines
    assert "settings: library defaults + paper_math.yaml + toy.yaml + mine.yaml + command line" in printed.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "mine.yaml"]  # no run folder: nothing trained


@pytest.mark.slow
def test_train_a_user_workflow_and_reward_by_name_under_accelerate(tmp_path):
    (tmp_path / "tests_module.py").write_text(USER_MODULE)
    args = ["train", "--workflow", "tests_module:UserWorkflow", "--reward_funcs", "tests_module.reward"]
    args += ["--accelerate_config", "cpu", "--config", "toy", "--output_dir", "run", *TINY]
    run(args, tmp_path, PYTHONPATH=str(tmp_path))
    saved = json.loads((tmp_path / "run" / "multiagent_config.json").read_text())
    assert saved["role_to_adapter"] == {"drafter": "drafter", "critic": "critic"}
    for role in ("drafter", "critic"):
        assert (tmp_path / "run" / role / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_vllm_serve_dry_run_prints_the_lora_flags_the_trainer_needs(tmp_path):
    printed = run(["vllm-serve", "--config", "toy", "--workflow", "voting", "--port", "8011", "--dry-run"], tmp_path)
    line = printed.stdout.strip().splitlines()[-1]  # (wandb, when installed, may print a line first)
    assert line.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve ")
    flags = "--port 8011 --enable-lora --max-loras 3 --max-lora-rank 16 --logprobs-mode processed_logprobs"
    assert line.endswith(flags)  # 2 role adapters (+1 slot), the preset's LoRA rank
    [shared], _, _ = vllm_serve_command(["--workflow", "orch_workers", "--policy_sharing", "shared"])
    argv = shared.argv
    assert argv[2] == "Qwen/Qwen3-1.7B" and argv[argv.index("--max-loras") + 1] == "2"
    assert argv[argv.index("--max-lora-rank") + 1] == "64"  # without --config: the paper preset, as the recipes


def test_commands_resolve_shipped_files_and_fail_with_the_choices():
    command = train_command(["voting", "--accelerate_config", "cpu", "--config", "cpu", "--max_steps", "2"])
    preset = shipped_file("cpu", "recipes/configs")
    assert command[-5:] == [str(ROOT / "recipes" / "voting_math.py"), "--config", preset, "--max_steps", "2"]
    assert "accelerate.commands.launch" in command
    assert command[command.index("--config_file") + 1] == str(ROOT / "accelerate_configs" / "cpu.yaml")
    with_reward = train_command(["single_agent", "--reward_funcs", "my.reward"])
    assert with_reward[1].endswith("train.py") and "trl_multiagent.workflows:SingleAgent" in with_reward
    shipped = "'cpu', 'cpu_code', 'paper_code', 'paper_eval', 'paper_math', 'toy', 'toy_code', 'toy_two_models'"
    with pytest.raises(FileNotFoundError, match=f"shipped: \\[{shipped}\\]"):
        train_command(["eval_opt", "--config", "nope"])
    assert train_command(["voting", "--config=cpu"])[-2:] == ["--config", preset]  # the form TrlParser reads
    with pytest.raises(SystemExit, match="not both"):
        train_command(["eval_opt", "--workflow", "a.b:C"])
    assert main([]) == 2


def test_eval_on_a_missing_run_folder_stops_with_one_line_naming_it(tmp_path):
    missing = tmp_path / "runs" / "no-such-run"
    done = subprocess.run(
        [*cli(), "eval", "--run_dir", str(missing), "--task", "math", "--limit", "5"],
        cwd=tmp_path,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"evaluate: --run_dir {missing}: no such folder (a training run's --output_dir, or one of its checkpoint-N "
        "folders)."
    )
