"""`lr_scheduler_steps`: the Trainer's one scheduler step per training step, or upstream verl's one per adapter update
call (k per training step with k adapters), against verl's cosine with warm-up written out here."""

from __future__ import annotations

import math

import pytest
import torch
from presets import CONFIGS, ON_CPU, recipe_args
from tiny import half_right_answers, tiny_trainer
from torch.optim.optimizer import register_optimizer_step_pre_hook
from transformers import get_scheduler

from trl_multiagent import MultiAgentGRPOConfig, Voting
from trl_multiagent.adapters.per_update_lr import UpdateCallScheduler
from trl_multiagent.adapters.routing import adapter_parameters

PEAK, WARMUP, TOTAL = 2e-5, 15, 500


def verl_cosine(index: int, warmup: int = WARMUP, total: int = TOTAL) -> float:
    """verl's get_cosine_schedule_with_warmup (min_lr_ratio 0, num_cycles 0.5, init_lr_ratio 0) at scheduler index
    ``index``: linear warm-up from 0, then 0.5 (1 + cos(pi progress)) with progress not clamped at 1."""
    if index < warmup:
        return index / max(1, warmup)
    progress = (index - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def lrs_seen(k: int, steps: int, mode: str, schedule: str) -> dict[tuple[int, int], float]:
    """(training step, adapter) -> learning rate of that adapter's optimizer steps, with the Trainer's cosine stepped
    as the trainer steps it: `schedule="mini_batches"`, each adapter's two mini-batch steps after one another;
    `"merged"`, one optimizer step for all k adapters."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    if mode == "per_update":
        scheduler = UpdateCallScheduler(scheduler, calls_per_step=k)
    seen = {}
    for step in range(steps):
        for adapter in range(k):
            for _ in range(2 if schedule == "mini_batches" else 1):
                if schedule == "mini_batches" and mode == "per_update":
                    scheduler.starts(f"adapter{adapter}")
                lr = optimizer.param_groups[0]["lr"]
                assert seen.setdefault((step, adapter), lr) == lr  # one rate through an adapter's update call
                optimizer.step()
        scheduler.step()  # the Trainer's, after the training step's last optimizer step
    return seen


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("schedule", ["mini_batches", "merged"])
def test_the_lr_each_adapter_sees_follows_verls_cosine(k, schedule):
    per_update, per_training_step = (
        lrs_seen(k, 500, "per_update", schedule),
        lrs_seen(k, 500, "per_training_step", schedule),
    )
    for step in (0, 1, 14, 15, 16, 100, 165, 250, 400, 499):
        for adapter in range(k):
            # verl: update call j of the run (adapter `adapter` of training step `step`) trains at index j; under the
            # merged schedule all k calls of a step take one optimizer step, at the first one's rate.
            index = k * step + (adapter if schedule == "mini_batches" else 0)
            assert per_update[step, adapter] == pytest.approx(PEAK * verl_cosine(index), rel=1e-9, abs=1e-15)
            assert per_training_step[step, adapter] == pytest.approx(PEAK * verl_cosine(step), rel=1e-9, abs=1e-15)
    if k == 2:  # past max_steps / k the cosine rises again: back near the peak at the end of the run
        assert per_update[250, 0] == 0.0 and per_update[499, 0] > 0.99 * PEAK
        assert per_training_step[499, 0] < 1e-3 * PEAK


def lr_per_optimizer_step(trainer) -> list[tuple[float, tuple[str, ...]]]:
    """(learning rate, adapters with a gradient) of every optimizer step the trainer takes."""
    seen = []

    def record(optimizer, args, kwargs):
        moved = tuple(
            a
            for a in trainer._updates.installed.adapter_names
            if any(p.grad is not None for p in adapter_parameters(trainer.model, a).values())
        )
        seen.append((optimizer.param_groups[0]["lr"], moved))

    handle = register_optimizer_step_pre_hook(record)
    trainer.train()
    handle.remove()
    return seen


@pytest.mark.parametrize(
    "mode, schedule", [("per_update", "mini_batches"), ("per_update", "merged"), ("per_training_step", "mini_batches")]
)
def test_trainer_steps_the_scheduler_per_adapter_update(tiny_model_dir, tmp_path, mode, schedule):
    """Isolated Voting (adapters generator and aggregator), 3 training steps of a cosine over max_steps=3 with 2
    warm-up steps: per update the scheduler advances 2 per step and runs past its horizon (index 4 is the peak
    again)."""
    lr = 1e-2
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        respond=half_right_answers,
        policy_sharing="isolated",
        seed=0,
        max_steps=3,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        lr_scheduler_steps=mode,
        update_schedule=schedule,
        mini_batch_prompts=1,
        per_device_train_batch_size=8,
        save_strategy="no",
        logging_steps=1,
    )
    seen = lr_per_optimizer_step(trainer)
    k = 2 if mode == "per_update" else 1
    assert trainer.lr_scheduler.last_epoch == 3 * k
    if schedule == "merged":
        assert [adapters for _, adapters in seen] == [("generator", "aggregator")] * 3
        expected = [lr * verl_cosine(k * step, warmup=2, total=3) for step in range(3)]
        assert [rate for rate, _ in seen] == pytest.approx(expected)
        return
    # 2 prompts x 4 episodes, mini-batches of 1 prompt: the generator (3 voters) 6 steps, then the aggregator 2.
    calls = [("generator",)] * 6 + [("aggregator",)] * 2
    assert [adapters for _, adapters in seen] == calls * 3
    for step in range(3):
        rates = [rate for rate, _ in seen[8 * step : 8 * (step + 1)]]
        first, second = (k * step, k * step + 1) if k == 2 else (step, step)
        assert rates == pytest.approx([lr * verl_cosine(first, 2, 3)] * 6 + [lr * verl_cosine(second, 2, 3)] * 2)
    logged = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert logged == pytest.approx([seen[8 * s + 7][0] for s in range(3)])  # the rate of the step's last update


def test_the_paper_preset_steps_per_update_and_the_toy_presets_per_training_step():
    assert recipe_args("--output_dir", "unused", *ON_CPU, recipe="voting_math").lr_scheduler_steps == "per_update"
    for name in ("toy", "toy_code", "toy_two_models"):
        assert recipe_args("--config", str(CONFIGS / f"{name}.yaml")).lr_scheduler_steps == "per_training_step", name
    cpu = dict(output_dir="unused", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="lr_scheduler_steps` must be one of"):
        MultiAgentGRPOConfig(**cpu, lr_scheduler_steps="per_epoch")
    with pytest.raises(ValueError, match="Set lr_scheduler_steps='per_training_step' or another lr_scheduler_type"):
        MultiAgentGRPOConfig(
            **cpu, lr_scheduler_steps="per_update", lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps"
        )
