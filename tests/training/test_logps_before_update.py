"""The log-prob forwards before the update run only where the policy ratio is not exactly one: under mini-batches,
not for each adapter's first mini-batch (no update has moved that adapter yet when it trains), and the update is the
one every sample's own log-prob forward gives; `monitor_update_size` and the adapter check, which read every sample's
log-probs before the update, still get them."""

from __future__ import annotations

import pytest
import torch
from scripted import ScriptedBackend
from test_forward_padding import assert_same_update, record_gradients, uneven_answers
from tiny import ONE_SGD_STEP, tiny_trainer
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt
from trl_multiagent.training.batch import TrainingBatch
from trl_multiagent.training.forwards import first_of_each_adapter, old_logps_after_first


def record_logp_samples(trainer, optimizer_steps: list) -> list[int]:
    """The samples of every log-prob forward of the adapters before the step's first optimizer step (while
    ``optimizer_steps``, `record_gradients`'s, is empty)."""
    seen, forward = [], trainer._step_forwards.routed_logps

    def recording(batch, adapters, mode):
        if not optimizer_steps:
            seen.append(len(batch))
        return forward(batch, adapters, mode)

    trainer._step_forwards.routed_logps = recording
    return seen


class ReportingLogprobs(ScriptedBackend):
    """Scripted rollouts that report sampling log-probs, as vLLM does: the adapter check compares them with the
    trainer's before the update."""

    def generate(self, requests):
        results = super().generate(requests)
        for result in results:
            result.sampling_logprobs = [-1.0] * len(result.completion_ids)
        return results


def train(model_dir, output_dir, policy: str, *, backend=None, **config):
    trainer = tiny_trainer(
        model_dir,
        output_dir,
        EvalOpt(max_iterations=2),
        respond=None if backend else uneven_answers,
        backend=backend,
        policy_sharing=policy,
        update_schedule="mini_batches",
        mini_batch_prompts=1,
        gradient_accumulation_steps=2,
        **ONE_SGD_STEP,
        **config,
    )
    gradients = record_gradients(trainer)
    samples = record_logp_samples(trainer, gradients)
    batches, plan = [], trainer._adapter_steps.mini_batch_updates

    def recording(steps, **kwargs):  # the mini-batches as they train
        batches.extend(steps)
        return plan(steps, **kwargs)

    trainer._adapter_steps.mini_batch_updates = recording
    trainer.train()
    return trainer, (gradients, trainer.state.log_history[0]["loss"]), samples, batches


@pytest.mark.parametrize("policy", ["isolated", "shared"])
def test_each_adapters_first_mini_batch_has_no_log_prob_forward(tiny_model_dir, tmp_path, policy):
    """Eval-Opt, mini-batches of one prompt's episodes: with `monitor_update_size` every sample's log-probs before
    the update are computed (it reads them); without, only those of the mini-batches after each adapter's first, and
    the update is the same."""
    trainer, watched, every, _ = train(tiny_model_dir, tmp_path / "watched", policy, monitor_update_size=True)
    assert "role/generator/update_ratio" in trainer.state.log_history[0]
    trainer, ours, fewer, plan = train(tiny_model_dir, tmp_path / "plain", policy)
    assert_same_update(*ours[0:2], *watched[0:2])
    firsts = first_of_each_adapter(plan)
    assert sum(firsts) == (2 if policy == "isolated" else 1) and len(plan) > sum(firsts)
    for (_, part), first in zip(plan, firsts):
        assert (part.old_per_token_logps is None) == first
    assert sum(fewer) == sum(len(part) for (_, part), first in zip(plan, firsts) if not first)
    assert sum(every) == sum(len(part) for _, part in plan) > sum(fewer)


def test_the_adapter_check_still_reads_every_samples_log_probs(tiny_model_dir, tmp_path):
    """A backend that reports sampling log-probs: the adapter check compares every sample's with the trainer's before
    the update, so every sample gets them, once, and every mini-batch's loss uses them."""
    backend = ReportingLogprobs(AutoTokenizer.from_pretrained(tiny_model_dir), uneven_answers)
    trainer, _, samples, plan = train(tiny_model_dir, tmp_path, "isolated", backend=backend)
    assert "role/generator/sampler_gap_mean" in trainer.state.log_history[0]
    assert all(part.old_per_token_logps is not None for _, part in plan)
    assert sum(samples) == sum(len(part) for _, part in plan)


def test_old_logps_after_first_computes_each_later_mini_batch_once():
    def part(adapter: str, n: int) -> TrainingBatch:
        return TrainingBatch(
            prompt_ids=torch.ones(n, 2, dtype=torch.long),
            prompt_mask=torch.ones(n, 2),
            completion_ids=torch.ones(n, 3, dtype=torch.long),
            completion_mask=torch.ones(n, 3),
            advantages=torch.ones(n),
            roles=[adapter] * n,
            adapters=[adapter] * n,
            instances=torch.zeros(n, dtype=torch.long),
            episode_ids=torch.arange(n),
            truncated=torch.zeros(n, dtype=torch.bool),
            sample_weights=torch.ones(n),
            num_items_in_batch=torch.tensor(3.0 * n),
            num_samples_in_batch=torch.tensor(float(n)),
        )

    plan = [("a", part("a", 2)), ("b", part("b", 3)), ("a", part("a", 1)), ("b", part("b", 2)), ("a", part("a", 4))]
    asked = []

    def logps(mini_batch):
        asked.append((mini_batch.adapters[0], len(mini_batch)))
        return torch.full(mini_batch.completion_mask.shape, -1.0)

    done = old_logps_after_first(plan, logps)
    assert asked == [("a", 1), ("b", 2), ("a", 4)]
    assert [p.old_per_token_logps is None for _, p in done] == [True, True, False, False, False]
