"""Training forwards without padding waste: rows end-aligned (training/row_layout.py) and grouped by length
(`mini_batches.row_groups`, `mini_batches.micro_steps`) score and train as one padded batch in TRL's layout does,
and at the paper preset's lengths pad under a tenth of the tokens of their forwards."""

from __future__ import annotations

import functools
from collections import defaultdict

import pytest
import torch
from tiny import ONE_SGD_STEP, tiny_trainer

from trl_multiagent import EvalOpt
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.rollout.padding import padded
from trl_multiagent.testing import batch_of_lengths, eval_opt_call_lengths
from trl_multiagent.trainer import step_forwards as step_forwards_module
from trl_multiagent.trainer.grpo_seam import GRPOSeam
from trl_multiagent.training import forwards as forwards_module
from trl_multiagent.training import mini_batches
from trl_multiagent.training.loss_weights import generation_chunks, loss_ready
from trl_multiagent.training.row_layout import LaidOut

WORDS = "solve the problem answer step number final".split()


def uneven_answers(requests, rng) -> list[str]:
    """Answers of 0 to 40 words and a boxed number: calls of very different lengths in one step. No verdict says
    Correct, so every Eval-Opt iteration runs."""
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40))) + f" \\boxed{{{rng.randint(2, 9)}}}"
        for _ in requests
    ]


def model_calls(model, seen: list) -> object:
    """``model``, recording what each call gives it: (input ids' shape, attention mask, position ids)."""

    def call(*args, **kwargs):
        seen.append((tuple(kwargs["input_ids"].shape), kwargs.get("attention_mask"), kwargs.get("position_ids")))
        return model(*args, **kwargs)

    return call


@pytest.mark.parametrize("layout, multiple", [("rows", None), ("packed", None), ("rows", 8), ("packed", 16)])
def test_laid_out_rows_score_as_trls_padded_rows(tiny_model_dir, tmp_path, monkeypatch, layout, multiple):
    """The trainer's forward hook on rows of very different prompts and completions (one completion masked whole, as
    `mask_truncated_completions` masks it): the model gets no attention mask, each sample a row from its first column
    (``rows``) or every sample in one row with position ids restarting at each (``packed``, the layout of flash and
    flex attention), as wide as the samples need (a multiple of `pad_to_multiple_of` where set), and the log-probs and
    entropies of every completion token are TRL's own forward's on the padded rows."""
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(),
        respond=uneven_answers,
        policy_sharing="shared",
        pad_to_multiple_of=multiple,
    )
    monkeypatch.setattr(trainer._step_forwards, "forward_layout", lambda: layout)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (3, 17, 9, 30, 12)]
    completions = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (25, 2, 11, 7, 1)]
    prompt_ids, prompt_mask = padded(prompts, 0, side="left")
    completion_ids, completion_mask = padded(completions, 0, side="right")
    completion_mask[3] = 0  # a truncated call, masked whole: its tokens are padding to the forward
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    width = completion_ids.size(1)

    trainer.router.set(None)
    seen = []
    with trainer.router.route(["shared"] * 5):  # packed, the hook routes the one row it makes
        trls = GRPOSeam._logps_and_entropies(
            trainer, trainer.model, input_ids, attention_mask, width, compute_entropy=True
        )
        trainer._step_forwards.routed_samples = (trainer.router, ["shared"] * 5)
        ours = trainer._logps_and_entropies(
            model_calls(trainer.model, seen), input_ids, attention_mask, width, compute_entropy=True
        )
    [(shape, mask, positions)] = seen
    assert mask is None and input_ids.shape == (5, 55)
    if layout == "rows":  # the longest: 30 + none (3 + 25 the next)
        assert shape == ((5, 30) if multiple is None else (5, 32)) and positions is None
    else:  # 28 + 19 + 20 + 30 + 13 tokens
        assert shape == ((1, 110) if multiple is None else (1, 112))
        starts = (positions[0] == 0).nonzero().flatten().tolist()
        assert starts == ([0, 28, 47, 67, 97] if multiple is None else [0, 28, 47, 67, 97, 110])
    mask = completion_mask.bool()
    for mine, theirs in zip(ours[:2], trls[:2]):
        assert mine.shape == theirs.shape == (5, width)
        assert torch.allclose(mine[mask], theirs[mask], atol=1e-5, rtol=1e-5)
        assert (mine[~mask] == 0).all()
    assert ours[0][mask].abs().max() > 1.0  # a real forward: random weights give no log-prob near 0


@pytest.mark.parametrize("layout", ["rows", "packed"])
def test_laid_out_rows_narrower_than_the_completions(tiny_model_dir, tmp_path, monkeypatch, layout):
    """The longest completion of a forward masked whole (truncated) and every row no wider than the completion
    columns: the laid-out forward scores as TRL's (a voting run under mini-batches once failed here with an index
    error)."""
    trainer = tiny_trainer(tiny_model_dir, tmp_path, EvalOpt(), respond=uneven_answers, policy_sharing="shared")
    monkeypatch.setattr(trainer._step_forwards, "forward_layout", lambda: layout)
    prompt_ids, prompt_mask = padded([[7, 8, 9], [10, 11]], 0, side="left")
    completion_ids, completion_mask = padded([list(range(20, 30)), [31, 32, 33, 34]], 0, side="right")
    completion_mask[0] = 0  # the 10-token completion, masked whole: the rows hold 3 and 6 tokens
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)

    rows = LaidOut.of(input_ids, attention_mask, 10, layout=layout)
    assert rows.input_ids.shape == ((2, 6) if layout == "rows" else (1, 9))
    trainer.router.set(None)
    with trainer.router.route(["shared"] * 2):
        trls = GRPOSeam._logps_and_entropies(trainer, trainer.model, input_ids, attention_mask, 10)[0]
        trainer._step_forwards.routed_samples = (trainer.router, ["shared"] * 2)
        ours = trainer._logps_and_entropies(trainer.model, input_ids, attention_mask, 10)[0]
    mask = completion_mask.bool()
    assert ours.shape == trls.shape == (2, 10)
    assert torch.allclose(ours[mask], trls[mask], atol=1e-5, rtol=1e-5)
    assert (ours[~mask] == 0).all()


def test_a_sample_without_a_prompt_is_refused():
    """A completion token with nothing before it in its sample cannot be scored: packed, it would be predicted from
    the sample before."""
    input_ids = torch.tensor([[0, 5, 6, 7], [4, 5, 6, 7]])
    attention_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="needs a prompt"):
        LaidOut.of(input_ids, attention_mask, 3, layout="packed")


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
        step_forwards_module, "micro_steps", lambda batch, accumulation, **cut: generation_chunks(batch, **cut)
    )
    monkeypatch.setattr(trainer, "_logps_and_entropies", functools.partial(GRPOSeam._logps_and_entropies, trainer))
    for name in ("split_for_memory", "bounded_logps"):
        bounded = getattr(mini_batches, name)

        def unbounded(*args, bounded=bounded, **kwargs):
            return bounded(*args, **{**kwargs, "max_samples": 10**9, "max_tokens": None})

        monkeypatch.setattr(forwards_module, name, unbounded)


def record_forwards(trainer) -> list[tuple[torch.Tensor, bool]]:
    """The input ids of every forward the model's decoder receives, and whether an attention mask came with them."""
    seen = []

    def record(module, args, kwargs):
        seen.append((kwargs["input_ids"], kwargs.get("attention_mask") is not None))

    trainer.model.get_base_model().model.register_forward_pre_hook(record, with_kwargs=True)
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


def train_one_step(model_dir, output_dir, monkeypatch, *, padded_reference=False, layout=None, **config):
    """One training step of Eval-Opt with answers of 0 to 40 words, two micro-steps per optimizer step, at most 800
    tokens per forward: the adapters' gradients at each optimizer step, the logged loss, the forwards' input ids
    (with whether a mask reached the model) and the padding token. ``padded_reference``: trained as commit d531c8e
    trained (`one_padded_forward`); ``layout``: the forwards' layout in place of the attention's own."""
    with monkeypatch.context() as patch:
        trainer = tiny_trainer(
            model_dir,
            output_dir,
            EvalOpt(max_iterations=2),
            respond=uneven_answers,
            mini_batch_prompts=1,
            max_tokens_per_micro_batch=800,
            gradient_accumulation_steps=2,
            **ONE_SGD_STEP,
            **config,
        )
        if padded_reference:
            one_padded_forward(trainer, patch)
        if layout is not None:
            patch.setattr(trainer._step_forwards, "forward_layout", lambda: layout)
        gradients, forwards = record_gradients(trainer), record_forwards(trainer)
        trainer.train()
        return gradients, trainer.state.log_history[0]["loss"], forwards, trainer._text_tokenizer.pad_token_id


def assert_same_update(steps, loss, reference_steps, reference_loss) -> None:
    scale = max(g.abs().max().item() for step in reference_steps for g in step.values())
    assert scale > 0 and len(steps) == len(reference_steps)
    for step, reference in zip(steps, reference_steps):
        assert step.keys() == reference.keys() and reference
        gap = max((step[n] - reference[n]).abs().max().item() for n in reference)
        assert gap <= 1e-4 * scale, (gap, scale)
    assert loss == pytest.approx(reference_loss, rel=1e-4, abs=1e-7)


# Every policy with every schedule, and each loss type (grpo: per sample; bnpo: per token of a forward; dapo: per
# token of the generation batch) with each policy and each schedule; each in start-aligned rows (SDPA's layout here)
# or packed (flash and flex attention's; on SDPA here, which reads the packing as a block-diagonal mask).
@pytest.mark.parametrize(
    "policy, schedule, loss_type, layout",
    [
        ("isolated", "merged", "grpo", "rows"),
        ("isolated", "mini_batches", "bnpo", "packed"),
        ("shared", "merged", "bnpo", "rows"),
        ("shared", "mini_batches", "grpo", "rows"),
        ("isolated", "merged", "dapo", "packed"),
        ("shared", "mini_batches", "dapo", "packed"),
        ("isolated", "mini_batches", "grpo", "packed"),
    ],
)
def test_forwards_without_a_mask_train_as_one_padded_batch(
    tiny_model_dir, tmp_path, monkeypatch, policy, schedule, loss_type, layout
):
    """Trained in forwards of at most 800 tokens (a longer call alone), grouped by length, no mask reaching the
    model, every optimizer step applies the gradients, and the step logs the loss, of one padded forward per adapter
    and micro-step in TRL's layout (its mask reaching the model), with less padding."""
    config = dict(policy_sharing=policy, update_schedule=schedule, loss_type=loss_type)
    *reference, padded_forwards, pad = train_one_step(
        tiny_model_dir, tmp_path / "padded", monkeypatch, padded_reference=True, **config
    )
    *ours, our_forwards, _ = train_one_step(tiny_model_dir, tmp_path / "ours", monkeypatch, layout=layout, **config)
    assert_same_update(*ours, *reference)

    assert all(masked for _, masked in padded_forwards) and not any(masked for _, masked in our_forwards)
    if layout == "packed":  # one row per adapter, each at most 800 tokens of its samples
        assert all(ids.size(0) <= 2 and int((ids != pad).sum()) <= 800 for ids, _ in our_forwards)
    else:
        assert all(ids.numel() <= 800 or ids.size(0) == 1 for ids, _ in our_forwards)
    assert len(our_forwards) > len(padded_forwards)
    share = {
        name: 1 - sum(int((ids != pad).sum()) for ids, _ in run) / sum(ids.numel() for ids, _ in run)
        for name, run in (("padded", padded_forwards), ("ours", our_forwards))
    }
    assert share["ours"] < share["padded"]


@pytest.mark.parametrize("layout", ["rows", "packed"])
def test_pad_to_multiple_of_widens_every_training_forward(tiny_model_dir, tmp_path, monkeypatch, layout):
    """TRL's `pad_to_multiple_of` on the training forwards: every forward the model receives is a multiple of it
    wide, none was without it, and the update is the same."""
    config = dict(policy_sharing="isolated", update_schedule="mini_batches", loss_type="grpo", layout=layout)
    *plain, plain_forwards, _ = train_one_step(tiny_model_dir, tmp_path / "plain", monkeypatch, **config)
    *padded, padded_forwards, _ = train_one_step(
        tiny_model_dir, tmp_path / "padded", monkeypatch, pad_to_multiple_of=64, **config
    )
    assert_same_update(*padded, *plain)
    assert all(ids.size(1) % 64 == 0 for ids, _ in padded_forwards)
    assert not all(ids.size(1) % 64 == 0 for ids, _ in plain_forwards)


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
