"""What a stopped run's error tells the user to run: the newest complete checkpoint and the exact command that resumes
from it, as typed (`trl-multiagent train ...`, which hands its command line to the recipe) or as this process runs."""

from __future__ import annotations

import shlex
import sys

from trl_multiagent.checkpoints.atomic import REQUIRED_FILES
from trl_multiagent.checkpoints.resume_command import COMMAND_VARIABLE, resume_advice, with_resume_flag
from trl_multiagent.cli import commands as cli


def complete_checkpoint(run_dir, step: int) -> str:
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in REQUIRED_FILES:
        (folder / name).write_text("{}")
    return str(folder)


def test_the_resume_flag_replaces_any_the_command_had():
    argv = ["trl-multiagent", "train", "voting", "--resume_from_checkpoint", "old", "--resume_from_checkpoint=older"]
    assert with_resume_flag(argv, "new") == ["trl-multiagent", "train", "voting", "--resume_from_checkpoint", "new"]
    assert with_resume_flag(argv, None) == ["trl-multiagent", "train", "voting"]


def test_the_typed_command_resumes_from_the_newest_complete_checkpoint(tmp_path, monkeypatch):
    complete_checkpoint(tmp_path, 2)
    newest = complete_checkpoint(tmp_path, 10)
    (tmp_path / "checkpoint-12").mkdir()  # its save did not finish
    monkeypatch.setenv(COMMAND_VARIABLE, "trl-multiagent train voting --config toy --output_dir 'my runs/v'")
    assert resume_advice(str(tmp_path)) == (
        f"The run's newest complete checkpoint is {newest}: resume from it with `trl-multiagent train voting "
        f"--config toy --output_dir 'my runs/v' --resume_from_checkpoint {newest}`."
    )


def test_a_script_run_resumes_with_its_own_command_and_says_how_from_python(tmp_path, monkeypatch):
    newest = complete_checkpoint(tmp_path, 3)
    monkeypatch.delenv(COMMAND_VARIABLE, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["train_mine.py", "--output_dir", str(tmp_path)])
    command = shlex.join([sys.executable, "train_mine.py", "--output_dir", str(tmp_path)])
    assert resume_advice(str(tmp_path)) == (
        f"The run's newest complete checkpoint is {newest}: resume from it with `{command} --resume_from_checkpoint "
        f'{newest}` (from Python: `trainer.train(resume_from_checkpoint="{newest}")`).'
    )
    monkeypatch.setenv("LOCAL_RANK", "0")  # one of several processes: the launcher comes first
    assert f"`train_mine.py --output_dir {tmp_path} --resume_from_checkpoint {newest}`, after the launcher" in (
        resume_advice(str(tmp_path))
    )


def test_without_a_complete_checkpoint_the_run_starts_again(tmp_path, monkeypatch):
    (tmp_path / "checkpoint-1").mkdir()
    monkeypatch.setenv(COMMAND_VARIABLE, "trl-multiagent train eval_opt --resume_from_checkpoint true")
    assert resume_advice(str(tmp_path)) == (
        f"{tmp_path} holds no complete checkpoint yet: start the run again with `trl-multiagent train eval_opt`."
    )


def test_trl_multiagent_train_hands_its_command_line_to_the_recipe(monkeypatch):
    seen = {}

    def run(command, env=None):
        seen["env"] = env
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(cli.subprocess, "run", run)
    assert cli.main(["train", "voting", "--config", "toy", "--output_dir", "runs/a b"]) == 0
    assert seen["env"][COMMAND_VARIABLE] == "trl-multiagent train voting --config toy --output_dir 'runs/a b'"
