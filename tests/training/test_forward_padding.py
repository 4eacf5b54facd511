"""Training forwards without padding waste: rows end-aligned (training/row_layout.py) and grouped by length
(`mini_batches.row_groups`, `mini_batches.micro_steps`) score and train as one padded batch in TRL's layout does,
and at the paper preset's lengths pad under a tenth of the tokens of their forwards."""

from __future__ import annotations

import functools
from collections import defaultdict

import pytest
import torch
from tiny import tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.rollout.padding import padded
from trl_multiagent.testing import batch_of_lengths, eval_opt_call_lengths
from trl_multiagent.trainer import multiagent_grpo_trainer as trainer_module
from trl_multiagent.trainer.grpo_seam import GRPOSeam
from trl_multiagent.training import mini_batches
from trl_multiagent.training.loss_weights import generation_chunks, loss_ready
from trl_multiagent.training.row_layout import EndAligned

WORDS = "solve the problem answer step number final".split()


def uneven_answers(requests, rng) -> list[str]:
    """Answers of 0 to 40 words and a boxed number: calls of very different lengths in one step. No verdict says
    Correct, so every Eval-Opt iteration runs."""
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40))) + f" \\boxed{{{rng.randint(2, 9)}}}"
        for _ in requests
    ]


def test_end_aligned_rows_score_as_trls_padded_rows(tiny_model_dir, tmp_path):
    """The trainer's forward hook on rows of very different prompts and completions (one completion masked whole, as
    `mask_truncated_completions` masks it): the model gets each row's tokens last, as wide as the longest row, and the
    log-probs and entropies of every completion token are TRL's own forward's on the padded rows."""
    trainer = tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(), respond=uneven_answers, policy_sharing="shared")
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (3, 17, 9, 30, 12)]
    completions = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (25, 2, 11, 7, 1)]
    prompt_ids, prompt_mask = padded(prompts, 0, side="left")
    completion_ids, completion_mask = padded(completions, 0, side="right")
    completion_mask[3] = 0  # a truncated call, masked whole: its tokens are padding to the forward
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    width = completion_ids.size(1)

    rows = EndAligned.of(input_ids, attention_mask, width)
    assert rows.input_ids.shape == (5, 30) and input_ids.shape == (5, 55)  # the longest: 3 + 25, and 30 + none
    assert rows.attention_mask.sum(dim=1).tolist() == attention_mask.sum(dim=1).tolist()

    trainer._updates.installed.router.set(None)
    with trainer._updates.installed.router.route(["shared"] * 5):
        ours = trainer._logps_and_entropies(trainer.model, input_ids, attention_mask, width, compute_entropy=True)
        trls = GRPOSeam._logps_and_entropies(
            trainer, trainer.model, input_ids, attention_mask, width, compute_entropy=True
        )
    mask = completion_mask.bool()
    for mine, theirs in zip(ours[:2], trls[:2]):
        assert mine.shape == theirs.shape == (5, width)
        assert torch.allclose(mine[mask], theirs[mask], atol=1e-5, rtol=1e-5)
        assert (mine[~mask] == 0).all()
    assert ours[0][mask].abs().max() > 1.0  # a real forward: random weights give no log-prob near 0


def test_end_aligned_rows_narrower_than_the_completions(tiny_model_dir, tmp_path):
    """The longest completion of a forward masked whole (truncated) and every row no wider than the completion
    columns: the forward still gets a column before the first completion token, and scores as TRL's (a voting run
    under mini-batches failed here with an index error)."""
    trainer = tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(), respond=uneven_answers, policy_sharing="shared")
    prompt_ids, prompt_mask = padded([[7, 8, 9], [10, 11]], 0, side="left")
    completion_ids, completion_mask = padded([list(range(20, 30)), [31, 32, 33, 34]], 0, side="right")
    completion_mask[0] = 0  # the 10-token completion, masked whole: the rows hold 3 and 6 tokens
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)

    assert EndAligned.of(input_ids, attention_mask, 10).input_ids.shape == (2, 11)
    trainer._updates.installed.router.set(None)
    with trainer._updates.installed.router.route(["shared"] * 2):
        ours = trainer._logps_and_entropies(trainer.model, input_ids, attention_mask, 10)[0]
        trls = GRPOSeam._logps_and_entropies(trainer, trainer.model, input_ids, attention_mask, 10)[0]
    mask = completion_mask.bool()
    assert ours.shape == trls.shape == (2, 10)
    assert torch.allclose(ours[mask], trls[mask], atol=1e-5, rtol=1e-5)
    assert (ours[~mask] == 0).all()


def test_micro_steps_sort_rows_within_each_optimizer_step():
    """Four micro-steps per generation batch, two per optimizer step: each optimizer step keeps the samples it held
    when cut in order, sorted longest first across its two micro-steps, and each micro-step as many samples."""
    plans = eval_opt_call_lengths(12, seed=1)
    batch = batch_of_lengths(plans, shared=False)
    batch.advantages = torch.arange(len(batch), dtype=torch.float32)  # marks each sample
    cut = dict(steps=4, loss_type="bnpo", num_processes=1)
    before = generation_chunks(batch, **cut)
    after = mini_batches.micro_steps(batch, accumulation=2, **cut)
    assert [len(chunk) for chunk in after] == [len(chunk) for chunk in before]
    for step in range(2):
        held = [chunk.advantages.tolist() for chunk in before[2 * step : 2 * step + 2]]
        sorted_held = [chunk.advantages.tolist() for chunk in after[2 * step : 2 * step + 2]]
        assert sorted(sum(held, [])) == sorted(sum(sorted_held, []))
        lengths = [p + c for chunk in after[2 * step : 2 * step + 2] for p, c in zip(*chunk.lengths())]
        assert lengths == sorted(lengths, reverse=True)
    # Three micro-steps, two per optimizer step: a micro-step may share an optimizer step with the next generation
    # batch's, so no sample leaves its micro-step.
    cut = dict(steps=3, loss_type="grpo", num_processes=1)
    for chunk, kept in zip(mini_batches.micro_steps(batch, accumulation=2, **cut), generation_chunks(batch, **cut)):
        assert sorted(chunk.advantages.tolist()) == sorted(kept.advantages.tolist())


def one_padded_forward(trainer, monkeypatch) -> None:
    """``trainer`` as commit d531c8e trained without a memory bound: TRL's layout (left-padded prompts, right-padded
    completions), micro-steps cut in the shuffled order, each micro-step one forward per adapter."""
    monkeypatch.setattr(
        trainer_module, "micro_steps", lambda batch, accumulation, **cut: generation_chunks(batch, **cut)
    )
    monkeypatch.setattr(trainer, "_logps_and_entropies", functools.partial(GRPOSeam._logps_and_entropies, trainer))
    for name in ("split_for_memory", "bounded_logps"):
        bounded = getattr(mini_batches, name)

        def unbounded(*args, bounded=bounded, **kwargs):
            return bounded(*args, **{**kwargs, "max_samples": 10**9, "max_tokens": None})

        monkeypatch.setattr(trainer_module, name, unbounded)


def record_forwards(monkeypatch) -> list[tuple[int, int, int]]:
    """(rows, width, own tokens) of every forward TRL's log-prob computation runs."""
    seen, forward = [], GRPOSeam._logps_and_entropies

    def recording(self, model, input_ids, attention_mask, *args, **kwargs):
        seen.append((input_ids.size(0), input_ids.size(1), int(attention_mask.sum())))
        return forward(self, model, input_ids, attention_mask, *args, **kwargs)

    monkeypatch.setattr(GRPOSeam, "_logps_and_entropies", recording)
    return seen


def record_gradients(trainer) -> list[dict[str, torch.Tensor]]:
    """The adapters' gradients at each optimizer step, as the optimizer is about to apply them."""
    steps, create = [], trainer.create_optimizer

    def gradients() -> dict[str, torch.Tensor]:
        params = {
            f"{a}/{n}": p
            for a in trainer._updates.installed.adapter_names
            for n, p in adapter_parameters(trainer.model, a).items()
        }
        return {name: p.grad.detach().clone() for name, p in params.items() if p.grad is not None}

    def creating(model=None):
        optimizer = create(model)
        optimizer.register_step_pre_hook(lambda *_: steps.append(gradients()))
        return optimizer

    trainer.create_optimizer = creating
    return steps


# Every policy with every schedule, and each loss type (grpo: per sample; bnpo: per token of a forward; dapo: per
# token of the generation batch) with each policy and each schedule.
@pytest.mark.parametrize(
    "policy, schedule, loss_type",
    [
        ("isolated", "merged", "grpo"),
        ("isolated", "mini_batches", "bnpo"),
        ("shared", "merged", "bnpo"),
        ("shared", "mini_batches", "grpo"),
        ("isolated", "merged", "dapo"),
        ("shared", "mini_batches", "dapo"),
    ],
)
def test_length_grouped_forwards_train_as_one_padded_batch(
    tiny_model_dir, tmp_path, monkeypatch, policy, schedule, loss_type
):
    """Eval-Opt with answers of 0 to 40 words, two micro-steps per optimizer step: trained in end-aligned forwards
    of at most 800 tokens (a longer call alone), grouped by length, every optimizer step applies the gradients, and
    the step logs the loss, of one padded forward per adapter and micro-step in TRL's layout, with less padding."""
    runs = {}
    for layout in ("padded", "grouped"):
        with monkeypatch.context() as patch:
            forwards = record_forwards(patch)
            trainer = tiny_trainer(
                tiny_model_dir,
                tmp_path / layout,
                EvalOpt(max_iterations=2),
                respond=uneven_answers,
                policy_sharing=policy,
                update_schedule=schedule,
                mini_batch_prompts=1,
                loss_type=loss_type,
                max_tokens_per_micro_batch=800,
                training_summary=False,
                gradient_accumulation_steps=2,
                max_steps=1,
                logging_steps=1,
                learning_rate=0.05,
                optim="sgd",
                max_grad_norm=0.0,
                save_strategy="no",
                seed=0,
            )
            if layout == "padded":
                one_padded_forward(trainer, patch)
            gradients = record_gradients(trainer)
            trainer.train()
            loss = trainer.state.log_history[0]["loss"]
            runs[layout] = gradients, loss, forwards
    (padded_steps, padded_loss, padded_forwards), (grouped_steps, grouped_loss, grouped_forwards) = runs.values()
    assert len(grouped_steps) == len(padded_steps) >= (1 if schedule == "merged" else 4)
    scale = max(g.abs().max().item() for step in padded_steps for g in step.values())
    assert scale > 0
    for grouped, reference in zip(grouped_steps, padded_steps):
        assert grouped.keys() == reference.keys() and reference
        gap = max((grouped[n] - reference[n]).abs().max().item() for n in reference)
        assert gap <= 1e-4 * scale, (gap, scale)
    assert grouped_loss == pytest.approx(padded_loss, rel=1e-4, abs=1e-7)

    assert all(rows * width <= 800 or rows == 1 for rows, width, _ in grouped_forwards)
    assert len(grouped_forwards) > len(padded_forwards)
    share = {name: 1 - sum(o for *_, o in run[2]) / sum(r * w for r, w, _ in run[2]) for name, run in runs.items()}
    assert share["grouped"] < share["padded"]


def paper_step_forwards(batch, schedule: str) -> tuple[list, list[list]]:
    """The log-prob forwards before the update and, per micro-step (``merged``) or mini-batch, the loss forwards of
    one paper-preset step of ``batch`` on one process (64 x 8 episodes, 8 micro-steps, mini-batches of 64 prompts)."""
    bounds = dict(max_samples=64, max_tokens=51200)
    logps = []
    if schedule == "mini_batches":

        def forward(part, adapters):
            logps.append(part)
            return torch.zeros(part.completion_mask.shape)

        mini_batches.bounded_logps(batch, batch.adapters, forward=forward, keys=batch.adapters, **bounds)
        plan = mini_batches.mini_batch_plan(
            batch,
            list(dict.fromkeys(batch.adapters)),
            mini_batch_size=512,
            num_processes=1,
            sum_over_processes=lambda t: t,
            loss_type="grpo",
            accumulation_steps=8,
            order="reference",
        )
        steps = [part for _, part in plan]
    else:
        torch.manual_seed(0)
        steps = mini_batches.micro_steps(batch.shuffled(), steps=8, accumulation=8, loss_type="grpo", num_processes=1)
    loss = [
        mini_batches.split_for_memory(loss_ready(step, "grpo"), loss_type="grpo", keys=step.adapters, **bounds)
        for step in steps
    ]
    return logps, loss


def padding_share(forwards: list) -> float:
    own = sum(sum(p + c for p, c in zip(*part.lengths())) for part in forwards)
    return 1 - own / sum(mini_batches.padded_tokens(part) for part in forwards)


def assert_full(forwards: list) -> None:
    """Each forward holds one adapter's rows, longest first and as wide as its longest; the next forward of its
    adapter holds shorter rows, and every forward but the last of its adapter is full: one more row breaks a bound."""
    by_adapter = defaultdict(list)
    for part in forwards:
        assert len(set(part.adapters)) == 1  # one adapter per forward
        by_adapter[part.adapters[0]].append(part)
    for parts in by_adapter.values():
        for part, following in zip(parts, parts[1:]):
            widths = [p + c for p, c in zip(*part.lengths())]
            assert max(widths) == widths[0] and max(p + c for p, c in zip(*following.lengths())) <= min(widths)
            assert len(part) == 64 or (len(part) + 1) * widths[0] > 51200


@pytest.mark.parametrize("schedule", ["merged", "mini_batches"])
@pytest.mark.parametrize("shared", [False, True])
def test_paper_lengths_pad_under_a_tenth_in_full_forwards(schedule, shared):
    """One paper-preset Eval-Opt step (512 episodes at the paper's lengths, `testing.eval_opt_call_lengths`): the
    log-prob and loss forwards pad under a tenth of their tokens, and each adapter's samples of a micro-step (of a
    mini-batch) fill their forwards up to the bounds, all but the last (benchmarks/padding_share.py: before, about
    half of every forward was padding)."""
    batch = batch_of_lengths(eval_opt_call_lengths(512, seed=0), shared=shared)
    logps, loss = paper_step_forwards(batch, schedule)
    for forwards in [logps, *loss] if logps else loss:
        assert_full(forwards)
    if logps:
        assert padding_share(logps) < 0.10
    assert padding_share([part for step in loss for part in step]) < 0.10
