"""Each drift alarm says what to do (the setting the records found to help, and the docs section), in its warning,
in the run report and, under `stop_on_drift`, in the resume command the stop prints."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import shlex
import types
from pathlib import Path

import pytest
from checkpoints.test_resume_command import complete_checkpoint
from monitoring.test_judge_base_rate import judging
from monitoring.test_monitoring import normal_log, with_changes
from transformers import TrainerControl, TrainerState

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.checkpoints.resume_command import COMMAND_VARIABLE, resume_advice
from trl_multiagent.monitoring import RoleDriftCallback
from trl_multiagent.monitoring.alarm_advice import ADVICE, DOCS, ROLE, advised_flags, alarm_advice
from trl_multiagent.monitoring.drift import _MEANING

ROOT = Path(__file__).resolve().parents[2]
BASE_RATE_DRIFT = [0.85, 0.8, 0.82, 0.8, 0.7, 0.55, 0.5, 0.5, 0.5]  # alarms at step 7 (test_judge_base_rate.py)


def headings(markdown: str) -> set[str]:
    """The anchors MkDocs gives the page's headings (lower case, punctuation dropped, spaces as dashes)."""
    titles = re.findall(r"^#+ (.+)$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-") for title in titles}


def test_every_alarm_kind_has_advice_whose_section_and_settings_exist():
    assert set(ADVICE) == set(_MEANING), "a new alarm kind joins ADVICE with what to do about it"
    anchors = headings((ROOT / DOCS).read_text())
    fields = {f.name for f in dataclasses.fields(MultiAgentGRPOConfig)}
    for kind, advice in ADVICE.items():
        assert advice.section in anchors, f"{kind}: {DOCS} has no section #{advice.section}"
        options = advice.flags[::2]
        assert all(o.startswith("--") and o[2:] in fields for o in options), (kind, options)
        assert bool(advice.setting) == bool(advice.flags), kind
        if advice.setting:  # the Python spelling names the same field as the flag
            assert advice.setting.split("=")[0] == options[0][2:], kind


def test_the_advised_flags_build_the_advised_config(tmp_path):
    alarms = [("evaluator", "judge_base_rate"), ("generator", "entropy_rise"), ("aggregator", "judge_code")]
    flags = advised_flags(alarms)
    settings = dict(zip((o[2:] for o in flags[::2]), flags[1::2]))
    args = MultiAgentGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **settings)
    assert (args.role_rewards, args.update_schedule) == ("balanced", "merged")
    assert args.role_loss_weights == {"aggregator": 8.0}


def test_one_weight_per_captured_judge_and_each_option_once():
    flags = advised_flags([("evaluator", "judge_code"), ("critic", "judge_length"), ("voter", "perplexity_rise")])
    assert flags[:2] == ["--role_loss_weights", json.dumps({"evaluator": 8.0, "critic": 8.0})]
    assert flags[2:] == ["--update_schedule", "merged"]
    assert advised_flags([("generator", "length_drift"), ("generator", "adapter_mismatch")]) == []
    assert ROLE not in " ".join(flags)


def test_the_warning_names_the_setting_and_the_section(caplog):
    callback = RoleDriftCallback()
    state, control = TrainerState(), TrainerControl()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.monitoring.drift"):
        for step, balanced in enumerate(BASE_RATE_DRIFT, start=1):
            state.global_step = step
            callback.on_log(None, state, control, logs=judging(step, balanced, 0.85))
    (warning,) = [r.getMessage() for r in caplog.records]
    assert 'What to do: set `role_rewards="balanced"`: the balanced judge reward' in warning
    assert warning.endswith(f"({DOCS}#a-judge-at-the-base-rate).")
    assert alarm_advice("judge_code", "critic").startswith('What to do: set `role_loss_weights={"critic": 8.0}`')


def stop_run(tmp_path, logs: list[dict], caplog) -> tuple[TrainerControl, list[str]]:
    """Feed ``logs`` to a stopping callback as Trainer.log does, in a run whose output folder is ``tmp_path``."""
    callback = RoleDriftCallback(stop_on_alarm=True, resume=functools.partial(resume_advice, str(tmp_path)))
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    state, control = TrainerState(), TrainerControl()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.monitoring.drift"):
        for step, entry in enumerate(logs, start=1):
            state.global_step = step
            state.log_history.append({**entry, "step": step})
            control = callback.on_log(args, state, control, logs=entry)
            if control.should_training_stop:
                break
    return control, [r.getMessage() for r in caplog.records]


def test_the_stop_prints_the_resume_command_with_the_advised_setting(tmp_path, monkeypatch, caplog):
    complete_checkpoint(tmp_path, 3)
    newest = complete_checkpoint(tmp_path, 6)
    (tmp_path / "checkpoint-7").mkdir()  # a save that did not finish
    typed = f"trl-multiagent train eval_opt --config toy --output_dir {tmp_path}"
    monkeypatch.setenv(COMMAND_VARIABLE, typed)
    logs = [judging(step, balanced, 0.85) for step, balanced in enumerate(BASE_RATE_DRIFT, start=1)]

    control, messages = stop_run(tmp_path, logs, caplog)

    assert control.should_training_stop
    alarm, stop = messages  # the alarm's warning, then the stop
    assert alarm.startswith("Role drift at step 7: role 'evaluator' judge_base_rate")
    assert stop.startswith("Training stops at step 7 on drift alarm(s) 'evaluator' judge_base_rate")
    command = re.search(r"resume from it with `([^`]+)`", stop).group(1)
    assert shlex.split(command) == [
        *shlex.split(typed),
        *("--resume_from_checkpoint", newest),
        *("--role_rewards", "balanced"),
    ]


def test_a_stop_without_a_measured_setting_resumes_as_the_run_was(tmp_path, monkeypatch, caplog):
    newest = complete_checkpoint(tmp_path, 2)
    monkeypatch.setenv(COMMAND_VARIABLE, "trl-multiagent train voting --config toy")
    logs = [normal_log(step) for step in range(1, 4)] + [with_changes(4, role__generator__truncated_fraction=0.3)]

    control, messages = stop_run(tmp_path, logs, caplog)

    assert control.should_training_stop
    assert "What to do: no record has measured a setting against it yet" in messages[0]
    assert f"`trl-multiagent train voting --config toy --resume_from_checkpoint {newest}`." in messages[1]
    assert "advised setting" not in messages[1]


@pytest.mark.parametrize("kind", sorted(ADVICE))
def test_the_report_row_of_an_alarm_says_what_to_do(kind):
    from trl_multiagent.cli.report import _alarms_section

    page = _alarms_section([{"step": 5, f"alarm/critic/{kind}": 1.0}])
    assert "what to do" in page and f"{DOCS}#{ADVICE[kind].section}" in page


def test_the_trainers_stop_resumes_from_its_own_run_folder(tiny_model_dir, tmp_path, monkeypatch):
    from tiny import tiny_trainer

    monkeypatch.setenv(COMMAND_VARIABLE, "trl-multiagent train voting --config toy")
    trainer = tiny_trainer(tiny_model_dir, tmp_path, stop_on_drift=True)
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, RoleDriftCallback)]
    assert callback.stop_on_alarm
    newest = complete_checkpoint(tmp_path, 4)
    assert f"--resume_from_checkpoint {newest} --update_schedule merged`" in callback.resume(
        ["--update_schedule", "merged"]
    )
