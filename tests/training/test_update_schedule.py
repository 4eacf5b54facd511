"""How a training step updates the adapters: the reference's sequential mini-batch steps per adapter vs one merged
step, per-adapter gradient clipping, and memory-bounded micro-batches that leave the update unchanged."""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import replace

import pytest
import torch
from presets import CONFIGS, preset, recipe_args
from scripted import addition_dataset
from tiny import half_right_answers, tiny_trainer

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, SingleAgent, Voting
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.config.multiagent_grpo_config import SettingsWarning
from trl_multiagent.monitoring.summary import first_last
from trl_multiagent.training.mini_batches import padded_tokens


def always_incorrect(requests, rng):
    """Isolated policy: the evaluator's adapter is "evaluator"; it rejects every attempt, so all iterations run."""
    answers = iter(half_right_answers(requests, rng))
    return ["\\boxed{Incorrect}" if r.adapter == "evaluator" else next(answers) for r in requests]


def make_trainer(model_dir, tmp_path, workflow, respond=half_right_answers, **overrides):
    settings = dict(
        per_device_train_batch_size=8,
        max_steps=1,
        logging_steps=1,
        learning_rate=5e-2,
        save_strategy="no",
        policy_sharing="isolated",
        seed=0,
        max_grad_norm=0.0,
        optim="sgd",
    )
    dataset = addition_dataset(8)
    return tiny_trainer(model_dir, tmp_path, workflow, dataset=dataset, respond=respond, **{**settings, **overrides})


def record_batches(trainer) -> list:
    """Each generation batch the trainer trains on, with every sample's log-probs before the update (the trainer
    itself computes them only for the mini-batches after each adapter's first, whose ratio is not one)."""
    batches, score = [], trainer._generate_and_score

    def recording(inputs):
        batch = score(inputs)
        old = batch.old_per_token_logps
        if old is None:
            with torch.no_grad():
                old = trainer._step_forwards.routed_logps(batch, batch.adapters, "train")
        batches.append(replace(batch, old_per_token_logps=old))
        return batch

    trainer._generate_and_score = recording
    return batches


def snapshot(model, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in adapter_parameters(model, adapter).items()}


def adam_steps(trainer, adapter: str) -> set[int]:
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    return {int(optimizer.state[p]["step"]) for p in adapter_parameters(trainer.model, adapter).values()}


def test_two_mini_batches_equal_two_hand_written_sgd_steps(tiny_model_dir, tmp_path):
    """8 episodes of one call each, mini-batches of 1 prompt x 4 episodes: two SGD steps, the second at the weights
    the first produced, each on the clipped GRPO loss against the log-probs recorded before the first."""
    lr = 0.5
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        policy_sharing="shared",
        learning_rate=lr,
        update_schedule="mini_batches",
        mini_batch_prompts=1,
        lr_scheduler_type="constant",
    )
    batches = record_batches(trainer)
    before = snapshot(trainer.model, "shared")
    trainer.train()
    trained = snapshot(trainer.model, "shared")
    logs = trainer.state.log_history[0]
    assert logs["adapter/shared/optimizer_steps"] == 2.0
    assert logs["role/generator/policy_ratio"] != 1.0  # the second mini-batch is scored at the new weights
    assert logs["role/generator/clip_fraction"] > 0.0

    batch = batches[0]
    assert len(batch) == 8 and batch.advantages.abs().sum() > 0
    params = adapter_parameters(trainer.model, "shared")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(before[name])
    trainer._updates.installed.router.set(None)
    eps = trainer.args.epsilon
    for rows in (slice(0, 4), slice(4, 8)):
        part = batch.select(rows)
        with trainer._updates.installed.router.route(["shared"] * 4):
            logps = trainer._logps_and_entropies(trainer.model, *part.model_inputs())[0]
        ratio = torch.exp(logps - part.old_per_token_logps)
        advantage = part.advantages.unsqueeze(1)
        per_token = -torch.min(ratio * advantage, torch.clamp(ratio, 1 - eps, 1 + eps) * advantage)
        mask = part.completion_mask
        loss = ((per_token * mask).sum(-1) / mask.sum(-1)).sum() / 4  # mean over the mini-batch of 4 samples
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        with torch.no_grad():
            for param, grad in zip(params.values(), grads):
                if grad is not None:
                    param -= lr * grad
    moved = max((trained[n] - before[n]).abs().max().item() for n in params)
    gap = max((trained[n] - params[n]).abs().max().item() for n in params)
    assert moved > 1e-3 and gap < 1e-6, (moved, gap)


@pytest.mark.parametrize("schedule, generator_steps", [("mini_batches", 3), ("merged", 1)])
def test_isolated_voting_generator_steps_follow_the_schedule(tiny_model_dir, tmp_path, schedule, generator_steps):
    trainer = make_trainer(tiny_model_dir, tmp_path, Voting(), update_schedule=schedule, optim="adamw_torch")
    trainer.train()
    assert adam_steps(trainer, "generator") == {generator_steps}  # 3 voters' samples = 3 mini-batches of 8
    assert adam_steps(trainer, "aggregator") == {1}
    logs = trainer.state.log_history[0]
    if schedule == "mini_batches":
        assert logs["adapter/generator/optimizer_steps"] == 3 * logs["adapter/aggregator/optimizer_steps"]
        assert logs["role/generator/policy_ratio"] != 1.0
    else:
        assert logs["role/generator/policy_ratio"] == 1.0  # one step on log-probs taken at the same weights


def test_mini_batches_larger_than_a_generation_batch_are_flagged(tmp_path):
    """A mini-batch bigger than the step's batch silently turns the reference's schedule into one step per adapter
    (the paper's 64 prompts on a 4-prompt toy batch); the config says so and how to fix it. The toy presets use
    one generation batch, the reference's ratio."""
    settings = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=32, num_generations=8)
    with pytest.warns(SettingsWarning, match="mini_batch_prompts=64 is more than the 4 prompts of one generation"):
        MultiAgentGRPOConfig(**settings, update_schedule="mini_batches", mini_batch_prompts=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SettingsWarning)
        MultiAgentGRPOConfig(**settings, update_schedule="mini_batches", mini_batch_prompts=4)
        MultiAgentGRPOConfig(**settings, update_schedule="merged", mini_batch_prompts=64)

    assert preset("paper_math")["mini_batch_prompts"] == 64
    for name in ("toy", "toy_code", "toy_two_models"):  # not the paper preset's 64
        args = recipe_args("--config", str(CONFIGS / f"{name}.yaml"), "--update_schedule", "mini_batches")
        assert args.mini_batch_prompts is None, name


@pytest.mark.parametrize("per_adapter", [True, False])
def test_per_adapter_clipping_isolates_a_role_with_a_huge_gradient(tiny_model_dir, tmp_path, per_adapter):
    common = dict(max_grad_norm=1e-3, clip_grad_norm_per_adapter=per_adapter)
    plain = make_trainer(tiny_model_dir, tmp_path / "plain", Voting(), **common)
    loud = make_trainer(
        tiny_model_dir, tmp_path / "loud", Voting(), role_loss_weights={"aggregator": 1000.0}, **common
    )
    updates = []
    for trainer in (plain, loud):
        before = snapshot(trainer.model, "generator")
        trainer.train()
        after = snapshot(trainer.model, "generator")
        updates.append({n: after[n] - before[n] for n in before})
    assert max(u.abs().max().item() for u in updates[0].values()) > 1e-7
    gap = max((updates[0][n] - updates[1][n]).abs().max().item() for n in updates[0])
    if per_adapter:
        assert gap < 1e-9  # the aggregator's 1000x gradient does not shrink the generator's step
    else:
        assert gap > 1e-7  # one global norm: the aggregator's gradient shrinks everyone's step


def largest_micro_batch(trainer) -> list[int]:
    sizes, compute = [], trainer.compute_loss

    def recording(model, inputs, *args, **kwargs):
        if model.training:
            sizes.append(padded_tokens(inputs))
        return compute(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording
    return sizes


@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_token_budget_bounds_every_forward_and_leaves_the_update_unchanged(tiny_model_dir, tmp_path, schedule):
    budget = 600
    peaks, updates = {}, {}
    for iterations in (1, 5):
        for bound in (None, budget):
            workflow = EvalOpt(max_iterations=iterations, history="fresh", prompts="guarded")
            trainer = make_trainer(
                tiny_model_dir,
                tmp_path / f"{iterations}-{bound}",
                workflow,
                respond=always_incorrect,
                update_schedule=schedule,
                max_tokens_per_micro_batch=bound,
                per_device_train_batch_size=8,
                gradient_accumulation_steps=1,
            )
            sizes = largest_micro_batch(trainer)
            before = {a: snapshot(trainer.model, a) for a in ("generator", "evaluator")}
            trainer.train()
            peaks[iterations, bound] = max(sizes)
            updates[iterations, bound] = {
                (a, n): p - before[a][n] for a in before for n, p in snapshot(trainer.model, a).items()
            }
    # Flat however many calls an episode makes (a fresh evaluator chat keeps each call's length bounded; in the shared
    # conversation one call alone grows with the attempts, and a call longer than the budget is its own forward).
    assert peaks[1, budget] <= budget and peaks[5, budget] <= budget
    assert peaks[5, None] > 2 * budget  # unbounded, the forward grows with the attempts
    for iterations in (1, 5):
        bounded, whole = updates[iterations, budget], updates[iterations, None]
        assert max(u.abs().max().item() for u in whole.values()) > 1e-6
        assert max((bounded[k] - whole[k]).abs().max().item() for k in whole) < 1e-6


def test_one_forward_per_adapter_and_one_mixed_forward_train_alike(tiny_model_dir, tmp_path):
    """Isolated Eval-Opt: by default each forward holds one adapter's samples; `mix_adapters_in_forward` routes one
    mixed batch through PEFT's per-sample path instead. Both give the same update."""
    updates, adapters_per_forward = {}, {}
    for mixed in (False, True):
        trainer = make_trainer(
            tiny_model_dir,
            tmp_path / str(mixed),
            EvalOpt(max_iterations=2),
            respond=always_incorrect,
            mix_adapters_in_forward=mixed,
            gradient_accumulation_steps=1,
        )
        seen, micro_batches = [], trainer._step_forwards.micro_batches

        def recording(batch, micro_batches=micro_batches, seen=seen):
            parts = micro_batches(batch)
            seen.extend(len(set(part.adapters)) for part in parts)
            return parts

        trainer._step_forwards.micro_batches = recording
        before = {a: snapshot(trainer.model, a) for a in ("generator", "evaluator")}
        trainer.train()
        adapters_per_forward[mixed] = seen
        updates[mixed] = {(a, n): p - before[a][n] for a in before for n, p in snapshot(trainer.model, a).items()}
    assert set(adapters_per_forward[False]) == {1} and 2 in adapters_per_forward[True]
    for adapter in ("generator", "evaluator"):  # both adapters moved
        assert max(u.abs().max().item() for (a, _), u in updates[False].items() if a == adapter) > 1e-6
    assert max((updates[False][k] - updates[True][k]).abs().max().item() for k in updates[True]) < 1e-6


def record_updates(trainer) -> dict[int, list[dict[str, float]]]:
    """Training step -> each of its optimizer updates' squared gradient norm per adapter, read from the gradients the
    optimizer is about to apply."""
    updates, create = defaultdict(list), trainer.create_optimizer

    def squares() -> dict[str, float]:
        params = {a: adapter_parameters(trainer.model, a).values() for a in trainer._updates.installed.adapter_names}
        return {
            a: sum(p.grad.double().pow(2).sum().item() for p in ps if p.grad is not None) for a, ps in params.items()
        }

    def creating(model=None):
        optimizer = create(model)
        optimizer.register_step_pre_hook(lambda *_: updates[trainer.state.global_step + 1].append(squares()))
        return optimizer

    trainer.create_optimizer = creating
    return updates


@pytest.mark.parametrize("max_grad_norm", [0.0, 1e6])  # no clipping; clipping that leaves every gradient as it is
@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_gradient_norms_and_shares_are_the_steps(tiny_model_dir, tmp_path, schedule, max_grad_norm):
    """Isolated Voting, mini-batches of one prompt: the generator takes 6 updates a step, the aggregator 2. Whatever
    the schedule, `grad_norm` is the norm of every update's gradient of the step, each adapter's norm is over its
    updates, and its share of the step's squared total adds up to 1 over the adapters."""
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        update_schedule=schedule,
        mini_batch_prompts=1,
        max_steps=2,
        max_grad_norm=max_grad_norm,
    )
    updates = record_updates(trainer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logs] == [1, 2] and sorted(updates) == [1, 2]
    for h in logs:
        seen = updates[h["step"]]
        if schedule == "mini_batches":
            assert len(seen) == h["adapter/generator/optimizer_steps"] + h["adapter/aggregator/optimizer_steps"] == 8
        else:
            assert len(seen) == 1
        squares = {a: sum(update[a] for update in seen) for a in ("generator", "aggregator")}
        total = sum(squares.values())
        assert total > 0
        assert h["grad_norm"] == pytest.approx(math.sqrt(total), rel=1e-5)
        for adapter, square in squares.items():
            assert h[f"adapter/{adapter}/grad_norm"] == pytest.approx(math.sqrt(square), rel=1e-5)
            assert h[f"adapter/{adapter}/grad_norm_share"] == pytest.approx(square / total, rel=1e-5)
            assert h[f"role/{adapter}/grad_norm_share"] == h[f"adapter/{adapter}/grad_norm_share"]
        shares = [v for k, v in h.items() if k.startswith("adapter/") and k.endswith("/grad_norm_share")]
        assert len(shares) == 2 and sum(shares) == pytest.approx(1.0, abs=1e-12)


def right_answers(requests) -> list[str]:
    """Every call answers "What is i + 2?" right: every group of episodes scores alike, so no sample has an
    advantage and no adapter gets a gradient."""
    return [f"\\boxed{{{int(i) + 2}}}" for i in (_problem(r) for r in requests)]


def _problem(request) -> str:
    messages = request.messages
    text = messages if isinstance(messages, str) else " ".join(m["content"] for m in messages)
    return text.split("What is ")[1].split(" + 2")[0]


@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
def test_a_step_without_gradient_logs_no_share(tiny_model_dir, tmp_path, schedule):
    """Step 1: every episode right, so no adapter gets a gradient: its norms are 0 and a share of nothing is no value,
    so none is logged. Step 2 has gradients: its shares add up to 1, and the end-of-run table takes the share from
    that step alone."""
    trainer = None

    def right_then_half_right(requests, rng):
        return right_answers(requests) if trainer.state.global_step == 0 else half_right_answers(requests, rng)

    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        respond=right_then_half_right,
        update_schedule=schedule,
        mini_batch_prompts=1,
        max_steps=2,
    )
    trainer.train()
    first, second = [h for h in trainer.state.log_history if "loss" in h]
    assert first["workflow/success"] == 1.0 and first["grad_norm"] == 0.0
    for adapter in ("generator", "aggregator"):
        assert first[f"adapter/{adapter}/grad_norm"] == first[f"role/{adapter}/grad_norm"] == 0.0
    assert not [key for key in first if key.endswith("grad_norm_share")]
    shares = [v for k, v in second.items() if k.startswith("adapter/") and k.endswith("/grad_norm_share")]
    assert second["grad_norm"] > 0 and len(shares) == 2 and sum(shares) == pytest.approx(1.0, abs=1e-12)
    table = first_last(trainer.state.log_history)
    (row,) = [row for row in table.role_rows if row[0] == "grad_norm_share"]
    expected = [second[f"role/{role}/grad_norm_share"] for role in table.roles]
    assert list(row[1:]) == [f"{value:.4g} -> {value:.4g}" for value in expected]
