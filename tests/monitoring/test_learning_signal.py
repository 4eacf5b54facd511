"""A run that cannot learn says why, early: most GRPO groups flat while a role fails its declared format."""

from __future__ import annotations

import logging
import math

import pytest
from peft import LoraConfig
from presets import workflow_options
from tiny import half_right_answers, tiny_trainer

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.monitoring.learning_signal import TOY_WORKFLOW_OPTIONS, LearningSignalCheck
from trl_multiagent.tasks import get_task
from trl_multiagent.workflows import Voting

LOGGER = "trl_multiagent.monitoring.learning_signal"

# The first 3 generation batches of `MultiAgentGRPOTrainer(model=toy, workflow=Voting(), ...)` on arithmetic, the toy
# preset's settings otherwise (4 prompts x 8 episodes, seed 0): the prompts whose 8 episodes all scored alike (4, 2
# and 4 of 4) and the roles' logged `unparseable` (test_the_toy_model_under_the_paper_options_warns_in_a_real_run
# runs it).
PAPER_BATCHES = [
    (4, {"role/generator/unparseable": 0.333, "role/aggregator/unparseable": 0.562}),
    (2, {"role/generator/unparseable": 0.052, "role/aggregator/unparseable": 0.656}),
    (4, {"role/generator/unparseable": 0.031, "role/aggregator/unparseable": 0.469}),
]
# The same with the toy preset's options (prompts="guarded", parsing="robust"): 1, 1 and 0 flat prompts of 4.
TOY_BATCHES = [
    (1, {"role/generator/unparseable": 0.0, "role/aggregator/unparseable": 0.0}),
    (1, {"role/generator/unparseable": 0.0, "role/aggregator/unparseable": 0.0}),
    (0, {"role/generator/unparseable": 0.01, "role/aggregator/unparseable": 0.0}),
]


def groups(flat: int, total: int = 4) -> list[list[float]]:
    """``total`` prompts' rewards over 8 episodes, the first ``flat`` of them all 0."""
    return [[0.0] * 8 if i < flat else [1.0, 0.0] * 4 for i in range(total)]


def replay(check: LearningSignalCheck, batches) -> list[dict[str, float]]:
    return [check.observe(groups(flat), metrics) for flat, metrics in batches]


def test_the_paper_options_on_the_toy_model_warn_once_naming_the_role_its_format_and_the_fix(caplog):
    workflow = Voting()
    check = LearningSignalCheck(workflow.formats, workflow.config_dict())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        alarms = replay(check, PAPER_BATCHES + PAPER_BATCHES)  # decided once, at the end of the first 3
    assert alarms == [{}, {}, {"alarm/aggregator/no_signal": 1.0}, {}, {}, {}]
    assert check.warned == {"aggregator": pytest.approx((0.562 + 0.656 + 0.469) / 3)}  # 56%; the generator's 14%
    (record,) = caplog.records
    message = record.getMessage()
    assert "83% of the prompts' GRPO groups had every episode scored alike" in message  # 10 of 12
    assert "role 'aggregator' failed its declared format Selection(n_candidates=3, rule='reference') in 56%" in message
    assert "this run: prompts='paper', parsing='reference'" in message
    assert "recipes/configs/toy.yaml: prompts: guarded, parsing: robust" in message
    assert "build Voting(prompts='guarded', parsing='robust') or train with --config toy" in message
    assert "generator" not in message.split("Likely fix")[0]


def test_the_toy_options_on_the_toy_model_do_not_warn(caplog):
    workflow = Voting(**{k: v for k, v in workflow_options("toy").items() if k in ("prompts", "parsing")})
    check = LearningSignalCheck(workflow.formats, workflow.config_dict())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert replay(check, TOY_BATCHES) == [{}, {}, {}]
    assert check.warned == {} and caplog.text == ""


@pytest.mark.parametrize(
    "batches",
    [
        [(1, metrics) for _, metrics in PAPER_BATCHES],  # unreadable outputs, but most groups carry a signal
        [(4, {"role/aggregator/unparseable": 0.2})] * 3,  # flat groups, but the format is followed
        PAPER_BATCHES[:2],  # the window is not over
    ],
    ids=["groups_carry_signal", "format_followed", "before_the_window_ends"],
)
def test_one_condition_alone_does_not_warn(batches):
    check = LearningSignalCheck(Voting().formats, Voting().config_dict())
    assert all(alarm == {} for alarm in replay(check, batches)) and check.warned == {}


def test_unscorable_episodes_are_left_out_of_a_groups_spread():
    check = LearningSignalCheck(Voting().formats, Voting().config_dict(), window=1)
    nan = math.nan
    metrics = {"role/aggregator/unparseable": 0.9}
    # one scored episode: no spread; two scored alike: none; two scored apart: a signal -> 2 of 3 flat
    assert check.observe([[1.0, nan, nan], [0.0, 0.0, nan], [0.0, 1.0, nan]], metrics) == {
        "alarm/aggregator/no_signal": 1.0
    }


def test_the_fix_names_the_toy_presets_options_as_they_are():
    assert TOY_WORKFLOW_OPTIONS == workflow_options("toy")


def flat_unreadable(requests, rng) -> list[str]:
    """Every voter wrong (all episodes score 0), the aggregator never writing its box."""
    return ["I pick the first one." if r.adapter == "aggregator" else r"\boxed{1}" for r in requests]


@pytest.mark.parametrize(("respond", "alarmed"), [(flat_unreadable, True), (half_right_answers, False)])
def test_the_trainer_warns_at_its_third_batch_when_it_cannot_learn(tiny_model_dir, tmp_path, caplog, respond, alarmed):
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        respond=respond,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        policy_sharing="isolated",
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    logs = [h for h in trainer.state.log_history if "role/aggregator/calls" in h]
    expected = [None, None, 1.0, None] if alarmed else [None] * 4
    assert [log.get("alarm/aggregator/no_signal") for log in logs] == expected
    assert ("role 'aggregator' failed its declared format" in caplog.text) == alarmed


@pytest.mark.slow
@pytest.mark.parametrize(("options", "warns"), [({}, True), ({"prompts": "guarded", "parsing": "robust"}, False)])
def test_the_toy_model_under_the_paper_options_warns_in_a_real_run(tmp_path, caplog, options, warns):
    """The shipped toy model on arithmetic with the toy preset's trainer settings, 3 steps of 4 prompts x 8 episodes:
    `Voting()` (the paper's prompts and readers) warns at step 3; `Voting` with the toy options does not."""
    task = get_task("math")
    args = MultiAgentGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=80,
        temperature=0.7,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        chat_rendering="tokenizer",
        chat_template_kwargs={"enable_thinking": False},
        seed=0,
        policy_sharing="isolated",
        training_summary=False,
    )
    trainer = MultiAgentGRPOTrainer(
        model="toy",  # the shipped toy model, by its registered name
        workflow=Voting(**options),
        reward_funcs=task.make_reward(),
        args=args,
        train_dataset=task.train_dataset("arithmetic", "train", 0),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0),
        answer_checker=task.answer_checker,
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    step3 = next(h for h in trainer.state.log_history if h.get("step") == 3 and "workflow/success" in h)
    assert ("alarm/aggregator/no_signal" in step3) == warns
    assert ("Selection(n_candidates=3, rule='reference')" in caplog.text) == warns
