"""TRL's entropy bonus and adaptive entropy control, per role: each acts on its own role's adapter, pushes that role's
entropy up, leaves a zero coefficient's update exactly as without it, and the adaptive state survives a resume."""

from __future__ import annotations

import json

import pytest
import torch
from scripted import addition_dataset
from tiny import TINY_TOKEN_BOUND, random_answers, tiny_trainer, update_gap, update_settings

from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.training.entropy_control import RoleEntropyControl


def same_answer(requests, rng) -> list[str]:
    return ["\\boxed{3}" for _ in requests]


def same_reward(completions, **kwargs) -> list[float]:
    return [1.0 for _ in completions]


def voting_run(tiny_model_dir, tmp_path, *, train=True, respond=random_answers, **overrides):
    settings = dict(
        per_device_train_batch_size=8,
        logging_steps=1,
        optim="sgd",
        max_grad_norm=0.0,  # global clipping would couple the adapters
        save_strategy="no",
        policy_sharing="isolated",
        seed=0,
    )
    settings.update(overrides)
    trainer = tiny_trainer(tiny_model_dir, tmp_path, dataset=addition_dataset(4), respond=respond, **settings)
    trainer.initial_weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    if train:
        trainer.train()
    return trainer


def role_gaps(a, b) -> dict[str, float]:
    gaps = {}
    for role in ("generator", "aggregator"):
        x, y = adapter_parameters(a.model, role), adapter_parameters(b.model, role)
        gaps[role] = max((x[n] - y[n]).abs().max().item() for n in x)
    return gaps


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def test_entropy_coef_raises_the_entropy_of_its_role_only(tiny_model_dir, tmp_path):
    # The global coefficient with the generator's own at 0: the aggregator alone gets the bonus.
    common = dict(max_steps=1, learning_rate=5e-2)
    plain = voting_run(tiny_model_dir, tmp_path / "plain", **common)
    bonus = voting_run(
        tiny_model_dir, tmp_path / "bonus", entropy_coef=0.5, role_entropy_coef={"generator": 0.0}, **common
    )
    gaps = role_gaps(plain, bonus)
    assert gaps["generator"] == 0.0  # a zero coefficient: today's update exactly
    assert gaps["aggregator"] > 1e-6
    assert logged(bonus, "role/aggregator/entropy_coef") == [0.5]

    # Where every episode scores the same, the advantages are 0 and the bonus is the whole update: the same batch
    # again (one prompt, the same answers) has a higher entropy for the role with the bonus, the same for the other.
    alone = dict(max_steps=2, learning_rate=1.0, per_device_train_batch_size=4)
    runs = {}
    for name, coef in (("none", None), ("bonus", {"aggregator": 1.0})):
        trainer = tiny_trainer(
            tiny_model_dir,
            tmp_path / f"alone-{name}",
            dataset=addition_dataset(1),
            respond=same_answer,
            reward_funcs=same_reward,
            optim="sgd",
            max_grad_norm=0.0,
            logging_steps=1,
            save_strategy="no",
            policy_sharing="isolated",
            seed=0,
            role_entropy_coef=coef,
            **alone,
        )
        trainer.train()
        runs[name] = {role: logged(trainer, f"role/{role}/entropy") for role in ("generator", "aggregator")}
    assert runs["none"]["aggregator"][1] == pytest.approx(runs["none"]["aggregator"][0], abs=1e-6)  # nothing moves
    assert runs["bonus"]["aggregator"][1] > runs["bonus"]["aggregator"][0] + 1e-3
    assert runs["bonus"]["generator"][1] == pytest.approx(runs["bonus"]["generator"][0], abs=1e-6)


@pytest.mark.parametrize("update", ["merged", "paper"])
def test_the_bonus_does_not_depend_on_how_a_step_is_cut_into_forwards(tiny_model_dir, tmp_path, update):
    """TRL takes its bonus's mean per forward; here each forward weighs by its share of the step's tokens, so the
    update is the same whether a micro-batch is one forward or several (by token bound and adapter)."""
    settings = {**update_settings(update), "max_steps": 1, "entropy_coef": 0.5, "learning_rate": 5e-2}
    settings.pop("max_tokens_per_micro_batch", None)
    whole = voting_run(tiny_model_dir, tmp_path / "whole", **settings)
    cut = voting_run(tiny_model_dir, tmp_path / "cut", max_tokens_per_micro_batch=TINY_TOKEN_BOUND // 2, **settings)
    plain = voting_run(tiny_model_dir, tmp_path / "plain", **{**settings, "entropy_coef": 0.0})
    for role in ("generator", "aggregator"):
        with_bonus, cut_bonus, without = (
            {n: p.detach() for n, p in adapter_parameters(run.model, role).items()} for run in (whole, cut, plain)
        )
        start = {n: whole.initial_weights[n] for n in with_bonus}
        assert update_gap(with_bonus, without, start) > 1e-3  # the bonus changes the update
        assert update_gap(cut_bonus, with_bonus, start) < 1e-4, role


def test_a_role_loss_weight_of_zero_still_freezes_a_role_with_a_bonus(tiny_model_dir, tmp_path):
    plain = voting_run(tiny_model_dir, tmp_path / "plain", max_steps=1, role_loss_weights={"aggregator": 0.0})
    bonus = voting_run(
        tiny_model_dir, tmp_path / "bonus", max_steps=1, entropy_coef=0.5, role_loss_weights={"aggregator": 0.0}
    )
    assert role_gaps(plain, bonus)["aggregator"] == 0.0


def test_adaptive_entropy_per_role_moves_and_resumes(tiny_model_dir, tmp_path):
    # The generator's target is above any entropy of the tiny model: its coefficient rises each step (and the bonus
    # applies from the second step, once an entropy was measured); the aggregator's is below any: its coefficient falls
    # to the floor and no bonus applies.
    adaptive = dict(
        use_adaptive_entropy=True,
        entropy_coef=0.05,
        entropy_coef_min=0.01,
        entropy_coef_max=1.0,
        entropy_coef_delta=0.1,
        entropy_target=0.0,
        role_entropy_target={"generator": 100.0},
        learning_rate=5e-2,
        save_strategy="steps",
        save_steps=2,
    )
    run = voting_run(tiny_model_dir, tmp_path / "run", max_steps=3, **adaptive)
    assert logged(run, "role/generator/entropy_coef") == pytest.approx([0.15, 0.25, 0.35])
    assert logged(run, "role/aggregator/entropy_coef") == pytest.approx([0.01, 0.01, 0.01])
    saved = json.loads((tmp_path / "run" / "checkpoint-2" / "role_entropy_control.json").read_text())
    assert saved["generator"]["entropy_coef"] == pytest.approx(0.25)
    assert 0.0 < saved["aggregator"]["last_entropy"] < 100.0

    # TRL's own controller is off: it would also write its state and add its one bonus to every role.
    assert not (tmp_path / "run" / "checkpoint-2" / "entropy_ctrl_state.json").exists()

    resumed = voting_run(tiny_model_dir, tmp_path / "run", max_steps=3, train=False, **adaptive)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert logged(resumed, "role/generator/entropy_coef")[-1] == pytest.approx(0.35)  # a fresh start gives 0.15


def test_the_controller_applies_nothing_before_its_first_measurement_and_then_follows_trls_rule():
    control = RoleEntropyControl(
        ["a", "b"],
        coef={"a": 0.2, "b": 0.2},
        target={"a": 1.0, "b": 3.0},
        adaptive=True,
        coef_min=0.0,
        coef_max=0.25,
        coef_delta=0.1,
        loss_weights={},
    )
    assert control.coefficients(["a", "b"], torch.device("cpu")).tolist() == [0.0, 0.0]  # TRL: inf > target
    entropies = torch.tensor([[2.0, 2.0, 9.0], [2.0, 2.0, 2.0]])
    kept = torch.tensor([[1, 1, 0], [1, 1, 1]])  # the 9 is a padded position
    control.observe(["a", "b"], entropies, kept)
    control.end_step(lambda t: t * 2, torch.device("cpu"))  # two processes alike: the mean is unchanged
    assert control.roles["a"].last_entropy == control.roles["b"].last_entropy == 2.0
    assert control.roles["a"].coef == pytest.approx(0.1)  # above its target: down by delta
    assert control.roles["b"].coef == pytest.approx(0.25)  # at most coef_max
    assert control.coefficients(["a", "b"], torch.device("cpu")).tolist() == pytest.approx([0.0, 0.25])
    control.end_step(lambda t: t, torch.device("cpu"))  # a step without tokens leaves the state as it was
    assert control.roles["a"].coef == pytest.approx(0.1) and control.roles["a"].last_entropy == 2.0
