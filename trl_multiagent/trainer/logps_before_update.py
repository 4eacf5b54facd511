"""The log-probs of a generation batch under the adapters as they are before the step's first update, and what reads
them: the loss (the old log-probs of its policy ratio, the base model's for the per-role KL term, TRL's
importance-sampling ratio on vLLM rollouts), the update size measured once the step's updates are done
(`monitor_update_size`, monitoring/update_size.py), and the check that each role was served by its own adapter at the
synced version (monitoring/adapter_check.py).

Which forwards a step needs is decided once per generation batch from the settings, alike on every process. The
forwards themselves are step_forwards.py's (``routed_logps``: every sample through the adapter given, in bounded
forwards);
they run inside ``no_grad_forwards()``, once for all a step needs: switching gradient checkpointing off and on walks
every module twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch
from accelerate.utils import gather

from ..adapters.routing import BASE_MODEL
from ..config import MultiAgentGRPOConfig
from ..monitoring.adapter_check import AdapterCheck
from ..monitoring.update_size import update_size_metrics, update_size_sums
from ..seams.transformers import checkpointing_off
from ..seams.trl import batch_importance_sampling_ratio
from ..training.batch import TrainingBatch
from ..training.forwards import old_logps_after_first, rollout_logps

RoutedLogps = Callable[[TrainingBatch, list[str], str], torch.Tensor]  # (batch, adapters, mode) -> [N, C] log-probs


@contextmanager
def without_gradients(model: torch.nn.Module, gradient_checkpointing_kwargs: dict | None) -> Iterator[None]:
    """Forwards that train nothing: no gradients, and no gradient checkpointing to recompute them."""
    with torch.no_grad(), checkpointing_off(model, gradient_checkpointing_kwargs):
        yield


class LogpsBeforeUpdate:
    """Adds to each generation batch the log-probs from before the update that this run reads, checks the adapters
    that served it, and measures the step's update size afterwards."""

    def __init__(
        self,
        args: MultiAgentGRPOConfig,
        *,
        roles: Sequence[str],
        routed_logps: RoutedLogps,
        no_grad_forwards: Callable[[], AbstractContextManager],
        adapter_check: AdapterCheck,
        record: Callable[[str, dict[str, float]], None],
        sum_over_processes: Callable[[torch.Tensor], torch.Tensor],
        global_step: Callable[[], int],
        ran_ahead: Callable[[], bool],
        backend_name: str,
    ):
        """``record(mode, values)``: the trainer's metric store; ``global_step()``: the optimizer steps so far;
        ``ran_ahead()``: whether the last episodes handed out ran during the step before (`rollout_ahead`);
        ``backend_name``: the rollout backend's, for the errors of `old_logprobs="rollout"`."""
        self.args, self.roles = args, list(roles)
        self.routed_logps, self.no_grad_forwards = routed_logps, no_grad_forwards
        self.adapter_check, self.record, self.sum_over_processes = adapter_check, record, sum_over_processes
        self.global_step, self.ran_ahead, self.backend_name = global_step, ran_ahead, backend_name
        self.update_size_before: tuple[TrainingBatch, torch.Tensor] | None = None  # (batch, its log-probs) this step

    def add(self, batch: TrainingBatch, episodes: Sequence, mode: str, *, role_beta: dict[str, float]) -> None:
        """The log-probs the loss needs from before the update, each sample through its own adapter (the reference's
        through none, while any role's ``role_beta`` is above 0); then the adapter check on them."""
        args = self.args
        generate_every = args.steps_per_generation * args.num_iterations
        recompute = args.old_logprobs == "recompute"  # else the rollout's, no forward (config/old_logprobs.py)
        sampled = None if recompute else rollout_logps(batch, backend=self.backend_name)
        correct_sampling = batch.sampling_per_token_logps is not None and args.vllm_importance_sampling_correction
        size = args.monitor_update_size and mode == "train"  # kept apart: the loss sees what it would without
        # Under mini-batches each adapter's first mini-batch has a policy ratio of exactly one: the others' log-probs
        # are computed once the mini-batches are cut (`add_to_mini_batches`), unless every sample's are read here.
        mini_batches = args.update_schedule == "mini_batches" and mode == "train"
        check = batch.sampling_per_token_logps is not None and recompute  # the adapter check compares the two
        every_sample = correct_sampling or size or check
        old = args.gradient_accumulation_steps % generate_every != 0 or correct_sampling
        old = old or (mini_batches and every_sample)
        if sampled is not None:  # under mini-batches, each mini-batch's own (`add_to_mini_batches`)
            if old and not mini_batches:
                batch.old_per_token_logps = sampled
            old = False
        reference = args.monitor_kl_to_base or any(role_beta.values())  # alike on every process
        if old or reference or size:
            with self.no_grad_forwards():
                if old:
                    batch.old_per_token_logps = self.routed_logps(batch, batch.adapters, mode)
                if size:
                    before = batch.old_per_token_logps if old else self.routed_logps(batch, batch.adapters, mode)
                    self.update_size_before = (batch, before)
                if reference:
                    batch.ref_per_token_logps = self.routed_logps(batch, [BASE_MODEL] * len(batch), mode)
        if correct_sampling:  # off under the paper preset: the reference only logs the rollout log-probs
            batch.importance_sampling_ratio = batch_importance_sampling_ratio(batch, args)
        self.check_adapters(batch, episodes, mode)

    def add_to_mini_batches(self, batch: TrainingBatch, plan: list[tuple[str, TrainingBatch]]) -> list:
        """Under `update_schedule="mini_batches"`, once ``batch`` is cut into the ``plan`` of its mini-batches: the
        log-probs before the update of every mini-batch but each adapter's first (its policy ratio is exactly one),
        computed before any of them trains (the rollout's under `old_logprobs="rollout"`); none where `add` read
        every sample's."""
        if batch.old_per_token_logps is not None:
            return plan
        if self.args.old_logprobs == "rollout":  # the sampler's, no forward
            return old_logps_after_first(plan, lambda part: part.sampling_per_token_logps)
        with self.no_grad_forwards():
            return old_logps_after_first(plan, lambda part: self.routed_logps(part, part.adapters, "train"))

    def check_adapters(self, batch: TrainingBatch, episodes: Sequence, mode: str) -> None:
        """Each role served by its own adapter at the synced version, per the backend's stamps and the gap between the
        sampler's log-probs and the trainer's before the update."""
        logps = batch.old_per_token_logps
        if batch.sampling_per_token_logps is None or self.args.old_logprobs == "rollout":  # nothing to compare
            logps = None
        elif logps is None:  # the loss's forward of these weights comes too late for the check
            with self.no_grad_forwards():
                logps = self.routed_logps(batch, batch.adapters, mode)
        metrics = self.adapter_check.check(
            calls=[c for e in episodes for c in e.calls],
            batch=batch,
            trainer_logps=logps,
            step=self.global_step(),
            ran_ahead=self.ran_ahead() and mode == "train",
            gather=gather,
        )
        self.record(mode, metrics)

    def log_update_size(self) -> None:
        """After a training step's updates: each role's policy ratio on the generation batch's tokens, now against
        before its first update (`monitor_update_size`)."""
        if self.update_size_before is None:
            return
        batch, before = self.update_size_before
        with self.no_grad_forwards():
            after = self.routed_logps(batch, batch.adapters, "train")
        sums = update_size_sums(self.roles, batch.roles, before=before, after=after, mask=batch.completion_mask)
        self.record("train", update_size_metrics(self.roles, self.sum_over_processes(sums)))
