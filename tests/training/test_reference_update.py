"""The update of the paper preset against the reference's actor update (verl's `dp_actor.update_policy`), computed
by hand on fixed examples: its policy loss (clip 0.2 / 0.28, dual clip c = 3, `seq-mean-token-mean`), its
dynamic-batch-size loss scale (each micro-batch's loss times its size over the mini-batch size, so a short last
mini-batch is divided by the full size), and its one update call per adapter under Isolated-Policy, each mini-batch
step clipped on that adapter's gradient alone."""

from __future__ import annotations

import math

import pytest
import torch
from presets import preset
from scripted import addition_dataset
from test_update_schedule import record_batches, snapshot
from tiny import half_right_answers, tiny_trainer

from trl_multiagent import SingleAgent, Voting
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.training.batch import TrainingBatch
from trl_multiagent.training.loss_weights import loss_ready

# What the paper preset sets for the loss and the update; the plain values are compared with the reference's config
# files in tests/recipes/test_paper_preset.py.
PAPER = preset("paper_math")
PAPER_UPDATE = {
    k: PAPER[k]
    for k in ("loss_type", "epsilon_high", "delta", "beta", "update_schedule", "clip_grad_norm_per_adapter")
}
LOW, HIGH, DUAL_CLIP = (
    0.2,
    0.28,
    3.0,
)  # verl: clip_ratio_low (default), clip_ratio_high (the fork's yaml), clip_ratio_c


def verl_policy_loss(logps, old_logps, advantages, mask):
    """verl's vanilla PPO policy loss with dual clip, aggregated `seq-mean-token-mean`, written from its formula:
    per token max(-A r, -A clip(r, 1 - low, 1 + high)), for A < 0 further min(., -A c); each sequence's token mean,
    then the mean over the sequences that have a token."""
    ratio = torch.exp(torch.clamp(logps - old_logps, -20.0, 20.0))
    a = advantages.unsqueeze(1)
    clipped = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - LOW, 1 + HIGH))
    per_token = torch.where(a < 0, torch.minimum(clipped, -a * DUAL_CLIP), clipped)
    tokens = mask.sum(-1)
    per_sequence = (per_token * mask).sum(-1) / (tokens + 1e-8)
    present = (tokens > 0).float()
    return (per_sequence * present).sum() / present.sum()


def sgd_step_as_verl(trainer, part: TrainingBatch, adapter: str, mini_batch_size: int, lr: float, max_norm: float):
    """One verl mini-batch step on ``part`` (one adapter's samples): dynamic batch size cuts it by tokens (here one
    sample per micro-batch, the finest cut), each micro-batch's loss times its size / ``mini_batch_size``, gradients
    accumulated, clipped to ``max_norm`` over the adapter's parameters (0: no clipping), one SGD step. Returns the
    gradient norm before clipping."""
    params = adapter_parameters(trainer.model, adapter)
    total = [torch.zeros_like(p) for p in params.values()]
    for i in range(len(part)):
        micro = part.select([i]).trimmed()
        with trainer._updates.installed.router.route([adapter]):
            logps = trainer._logps_and_entropies(trainer.model, *micro.model_inputs())[0]
        loss = verl_policy_loss(logps, micro.old_per_token_logps, micro.advantages, micro.completion_mask)
        grads = torch.autograd.grad(loss * len(micro) / mini_batch_size, list(params.values()), allow_unused=True)
        for acc, grad in zip(total, grads):
            if grad is not None:
                acc += grad
    norm = torch.stack([g.norm() for g in total]).norm().item()
    scale = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0  # torch's clip_grad_norm_
    with torch.no_grad():
        for param, grad in zip(params.values(), total):
            param -= lr * scale * grad
    return norm


def restore(trainer, before: dict[str, dict[str, torch.Tensor]]) -> None:
    with torch.no_grad():
        for adapter, weights in before.items():
            for name, param in adapter_parameters(trainer.model, adapter).items():
                param.copy_(weights[name])
    trainer._updates.installed.router.set(None)


def moved(before, after) -> float:
    return max((after[a][n] - before[a][n]).abs().max().item() for a in before for n in before[a])


@pytest.mark.parametrize("token_budget", [None, 120])
def test_short_last_mini_batch_is_divided_by_the_full_size_as_verl_does(tiny_model_dir, tmp_path, token_budget):
    """12 episodes (3 prompts x 4) of one call, mini-batches of 2 prompts x 4 = 8 samples: a full step, then a short
    one of 4 samples whose loss verl divides by 8 (its micro-batches' scale, size / ppo_mini_batch_size), not by 4.
    With a token budget our forwards are cut differently from the reference's (one sample each): the same update."""
    lr = 0.5
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        dataset=addition_dataset(12),
        respond=half_right_answers,
        **{**PAPER_UPDATE, "mini_batch_prompts": 2, "max_tokens_per_micro_batch": token_budget},
        per_device_train_batch_size=12,
        num_generations=4,
        max_steps=1,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        policy_sharing="shared",
        save_strategy="no",
        seed=0,
    )
    batches = record_batches(trainer)
    forwards = []
    compute = trainer.compute_loss

    def recording(model, inputs, *args, **kwargs):
        forwards.append(len(inputs))
        return compute(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording
    before = {"shared": snapshot(trainer.model, "shared")}
    trainer.train()
    ours = {"shared": snapshot(trainer.model, "shared")}
    assert trainer.state.log_history[0]["adapter/shared/optimizer_steps"] == 2.0
    if token_budget is not None:
        assert max(forwards) < 8  # the budget cut the mini-batches into several forwards

    batch = batches[0]
    assert len(batch) == 12 and batch.advantages[8:].abs().sum() > 0  # the short mini-batch carries a signal
    expected = {}
    for divisor in (8, 4):  # verl's scale, and a plain mean over the short mini-batch
        restore(trainer, before)
        sgd_step_as_verl(trainer, batch.select(slice(0, 8)), "shared", 8, lr, 0.0)
        sgd_step_as_verl(trainer, batch.select(slice(8, 12)), "shared", divisor, lr, 0.0)
        expected[divisor] = {"shared": snapshot(trainer.model, "shared")}
    assert moved(before, ours) > 1e-3
    gap = max((ours["shared"][n] - expected[8]["shared"][n]).abs().max().item() for n in ours["shared"])
    other = max((ours["shared"][n] - expected[4]["shared"][n]).abs().max().item() for n in ours["shared"])
    assert gap < 1e-6 and other > 1e-4, (gap, other)


def test_isolated_adapters_take_one_clipped_update_call_each(tiny_model_dir, tmp_path):
    """Isolated Voting, 8 episodes: the reference calls the actor update once per adapter with that adapter's samples
    only (generator: 24 voter calls, 3 mini-batches of 8; aggregator: 8, one), each mini-batch step at the current
    weights, its gradient clipped at 1.0 on its own adapter: the generator's first step is clipped (norm 1.5), the
    aggregator's (0.15) is not. Every forward holds one adapter's samples."""
    lr, max_norm = 0.5, PAPER["max_grad_norm"]
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        Voting(),
        dataset=addition_dataset(8),
        respond=half_right_answers,
        **PAPER_UPDATE,
        mini_batch_prompts=2,
        per_device_train_batch_size=8,
        max_steps=1,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=max_norm,
        policy_sharing="isolated",
        save_strategy="no",
        seed=0,
    )
    batches = record_batches(trainer)
    adapters_per_forward, micro_batches = [], trainer._step_forwards.micro_batches

    def recording(batch):
        parts = micro_batches(batch)
        adapters_per_forward.extend(len(set(part.adapters)) for part in parts)
        return parts

    trainer._step_forwards.micro_batches = recording
    names = ("generator", "aggregator")
    before = {a: snapshot(trainer.model, a) for a in names}
    trainer.train()
    ours = {a: snapshot(trainer.model, a) for a in names}
    assert set(adapters_per_forward) == {1}
    logs = trainer.state.log_history[0]
    assert logs["adapter/generator/optimizer_steps"] == 3.0 and logs["adapter/aggregator/optimizer_steps"] == 1.0

    batch = batches[0]
    norms, expected = {}, {}
    for adapter in names:  # one update call per adapter: its samples in episode order, cut into mini-batches of 8
        restore(trainer, before)  # each call from the step's starting weights (the adapters share no parameter)
        rows = [i for i, a in enumerate(batch.adapters) if a == adapter]
        for k in range(math.ceil(len(rows) / 8)):
            part = batch.select(rows[8 * k : 8 * (k + 1)])
            norms[adapter, k] = sgd_step_as_verl(trainer, part, adapter, 8, lr, max_norm)
        expected[adapter] = snapshot(trainer.model, adapter)
    assert norms["generator", 0] > 1.2 * max_norm  # clipped
    assert 0.0 < norms["aggregator", 0] < 0.5 * max_norm  # not clipped, whatever the generator's norm
    assert moved(before, ours) > 1e-3
    gap = max((ours[a][n] - expected[a][n]).abs().max().item() for a in names for n in ours[a])
    assert gap < 1e-5, gap


def fixed_batch(advantages, ratios, mask) -> TrainingBatch:
    """One adapter's samples with given advantages, per-token ratios (through the old log-probs) and mask."""
    n, c = mask.shape
    return TrainingBatch(
        prompt_ids=torch.full((n, 2), 5),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.full((n, c), 7),
        completion_mask=mask.long(),
        advantages=advantages,
        roles=["generator"] * n,
        adapters=["shared"] * n,
        instances=torch.zeros(n, dtype=torch.long),
        episode_ids=torch.arange(n),
        truncated=torch.zeros(n, dtype=torch.bool),
        sample_weights=torch.ones(n),
        num_items_in_batch=mask.sum().float(),
        num_samples_in_batch=torch.tensor(float(n)),
        old_per_token_logps=-1.0 - ratios.log(),  # the current log-probs are -1.0 everywhere
    )


RATIOS = torch.tensor([[0.5, 0.9, 1.1, 1.5], [0.7, 1.0, 1.25, 2.0], [0.6, 1.2, 1.4, 2.5], [1.0, 0.95, 1.3, 0.1]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
ADVANTAGES = torch.tensor([1.0, -0.5, -1.5, 0.8])


@pytest.mark.parametrize("dual_clip_binds", [False, True])
@pytest.mark.parametrize("delta", [PAPER["delta"], None])
def test_policy_loss_is_verls_seq_mean_token_mean_with_dual_clip(tiny_model_dir, tmp_path, delta, dual_clip_binds):
    """Our loss (TRL's `loss_type="grpo"` through the trainer) on fixed ratios, advantages and a ragged mask, and
    its gradient in the log-probs, against verl's formula. The paper preset's `delta=3.0` caps the ratio at 3,
    which for A < 0 is verl's dual clip and for A > 0 changes nothing (the ratio is clipped at 1.28 already). Without
    it (the library default) the two agree until a negative-advantage token's ratio passes 3; then ours is larger
    by |A| (r - 3) / (tokens x sequences) for that token and keeps a gradient verl does not have."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        SingleAgent(),
        respond=half_right_answers,
        **{**PAPER_UPDATE, "delta": delta},
        policy_sharing="shared",
        gradient_accumulation_steps=1,
    )
    ratios = RATIOS.clone()
    if dual_clip_binds:
        ratios[2, 1] = 4.0  # A = -1.5 < 0, ratio past c = 3 (sequence 2 has 2 tokens; 4 sequences)
    batch = fixed_batch(ADVANTAGES, ratios, MASK)
    logps = torch.full(MASK.shape, -1.0, requires_grad=True)

    def fixed_logps(*args, **kwargs):
        return logps, torch.zeros_like(logps), None

    trainer._logps_and_entropies = fixed_logps
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's loop, outside of which this runs
    ours = trainer.compute_loss(trainer.model, loss_ready(batch, trainer.loss_type))
    (ours_grad,) = torch.autograd.grad(ours, logps)
    verl = verl_policy_loss(logps, batch.old_per_token_logps, ADVANTAGES, MASK.float())
    (verl_grad,) = torch.autograd.grad(verl, logps)
    if delta is not None or not dual_clip_binds:
        assert torch.allclose(ours, verl, atol=1e-6) and torch.allclose(ours_grad, verl_grad, atol=1e-6)
    else:
        assert (ours - verl).item() == pytest.approx(1.5 * (4.0 - 3.0) / (2 * 4), abs=1e-6)
        differs = (ours_grad - verl_grad).abs() > 1e-6
        assert differs.nonzero().tolist() == [[2, 1]] and verl_grad[2, 1] == 0.0
