"""Judges are known by their declared format, not their name: a user's ``critic`` (a ``Verdict``) beside a ``drafter``
gets the judge metrics and the judge alarms the built-in evaluator gets."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from monitoring.test_monitoring import replay
from tiny import tiny_trainer
from user_workflows import DraftCritic

import trl_multiagent
from trl_multiagent.monitoring import RoleDriftCallback, workflow_metrics
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.workflows import EvalOpt, Voting

FOLDERS = ("monitoring", "training", "adapters", "rollout", "checkpoints")


def call(role: str, text: str) -> ModelCall:
    return ModelCall(role, 0, role, [], [1, 2], [3] * len(text.split()), text, truncated=False)


def contains(text: str, answer: str) -> bool:
    return f"\\boxed{{{answer}}}" in text


def test_a_critic_declaring_a_verdict_gets_the_judge_metrics():
    # Four drafts, two right ("4"); the critic calls every one Correct: right on the right ones only.
    episodes = [
        Episode(e, [call("drafter", rf"\boxed{{{a}}}"), call("critic", r"\boxed{Correct}")])
        for e, a in enumerate("4455")
    ]
    m = workflow_metrics(DraftCritic(), episodes, [1.0, 1.0, 0.0, 0.0], contains, ["4"] * 4)
    assert m["role/critic/verdict_accuracy"] == 0.5 and m["workflow/verdict_accuracy"] == 0.5
    assert m["role/critic/verdict_balanced_accuracy"] == 0.5  # right drafts 2/2, wrong ones 0/2
    assert m["workflow/verdict_correct_rate"] == 1.0 and m["workflow/verdict_unparseable_rate"] == 0.0
    assert m["role/critic/unparseable"] == 0.0 and m["workflow/regraded/drafter"] == 0.5


def user_log(critic_code: float, critic_words: float, balanced: float) -> dict[str, float]:
    """A log of a Draft-Critic run: the critic's style, length and judging; the drafter writes 200 words."""
    return {
        "workflow/success": 0.5,
        "role/drafter/words_median": 200.0,
        "role/critic/words_median": critic_words,
        "role/critic/code_block_fraction": critic_code,
        "role/critic/verdict_accuracy": 0.9,
        "role/critic/verdict_balanced_accuracy": balanced,
    }


@pytest.mark.parametrize(
    ("late", "kind", "metric"),
    [
        (user_log(0.8, 100.0, 0.85), "judge_code", "role/critic/code_block_fraction"),
        # 180 words: past 0.75 x the drafter's 200, under 3x its own start (no length_drift)
        (user_log(0.0, 180.0, 0.85), "judge_length", "role/critic/words_median"),
    ],
    ids=["judge_code", "judge_length"],
)
def test_a_critic_gets_the_judge_alarms(late, kind, metric):
    callback = RoleDriftCallback(formats=DraftCritic().formats)
    replay(callback, [user_log(0.0, 100.0, 0.85)] * 3 + [late])
    assert [(a.step, a.role, a.kind, a.metric) for a in callback.alarms] == [(4, "critic", kind, metric)]


def test_a_critic_drifting_to_the_base_rate_alarms():
    callback = RoleDriftCallback(formats=DraftCritic().formats)
    replay(callback, [user_log(0.0, 100.0, b) for b in (0.85, 0.85, 0.85, 0.5, 0.5, 0.5)])
    # balanced accuracy over the last 3 logs: step 5 (0.85 + 0.5 + 0.5) / 3 = 0.617 > 0.6; step 6: 0.5
    assert [(a.step, a.role, a.kind) for a in callback.alarms] == [(6, "critic", "judge_base_rate")]


def test_judges_and_solvers_are_read_from_the_declared_formats():
    critic = RoleDriftCallback(formats=DraftCritic().formats)
    assert (critic.judge_roles, critic.solver_roles) == ({"critic"}, {"drafter"})
    voting = RoleDriftCallback(formats=Voting().formats)  # a selection judges too
    assert (voting.judge_roles, voting.solver_roles) == ({"aggregator"}, {"generator"})
    assert RoleDriftCallback(formats=EvalOpt().formats).judge_roles == {"evaluator"}


def test_monitoring_and_training_name_no_built_in_role():
    """Roles are known by what the workflow declares: no code of the trainer or the folders it runs switches on a
    built-in role name (a string that is exactly one; docstrings and help texts name them inside longer text)."""
    names = {"evaluator", "aggregator", "generator", "voter", "orchestrator", "synthesizer", "worker"}
    package = Path(trl_multiagent.__file__).parent
    paths = [*(package / "trainer").glob("*.py"), *(p for folder in FOLDERS for p in (package / folder).rglob("*.py"))]
    for path in paths:
        named = {
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and node.value in names
        }
        assert not named, f"{path} names the built-in role(s) {sorted(named)}"


def test_training_a_user_workflow_raises_the_judge_alarm_on_its_critic(tiny_model_dir, tmp_path, caplog):
    """Four scripted steps: the critic gives verdicts, then from the fourth step writes programs instead."""
    trainer = None

    def respond(requests, rng):
        drifted = trainer.state.global_step >= 3
        texts = []
        for request in requests:
            if request.adapter == "critic":
                verdict = r"\boxed{Correct}" if rng.random() < 0.5 else r"\boxed{Incorrect}"
                texts.append(f"```python\nprint(4)\n```\n{verdict}" if drifted else verdict)
            else:
                texts.append(rf"\boxed{{{rng.choice([3, 4])}}}")
        return texts

    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        DraftCritic(),
        respond=respond,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        policy_sharing="isolated",
        answer_checker=lambda text, answer: str(answer) in text,
    )
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.monitoring.drift"):
        trainer.train()
    logs = [h for h in trainer.state.log_history if "role/critic/calls" in h]
    assert len(logs) == 4 and all("role/critic/verdict_accuracy" in log for log in logs)
    assert [log.get("alarm/critic/judge_code") for log in logs] == [None, None, None, 1.0]
    assert "role 'critic' judge_code" in caplog.text
