"""``TrainingMetrics``: the per-role and per-workflow metrics of a training step, summed over processes and recorded.

The trainer calls one method per thing it measured (a generation batch's episodes and samples, the role rewards, a
loss forward, an optimizer step's updates); each computes its metrics with the pure functions of ``role_metrics`` and
``workflow_metrics``, sums them over processes, and hands them to ``record(mode, values)``: TRL's metric store, which
TRL averages over the logging steps and logs to every ``report_to`` integration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..workflows.base import Workflow
from . import role_metrics
from .workflow_metrics import workflow_metrics

Record = Callable[[str, dict[str, float]], None]


class TrainingMetrics:
    """The metrics of one run, recorded through ``record(mode, values)``.

    Args:
        workflow: the workflow being trained (its roles and declared formats).
        record: ``(mode, values)`` -> None, ``mode`` ``"train"`` or ``"eval"``.
        record_column: ``(column, values)`` -> None: an extra column of TRL's completions table, from this process's
            ``values``.
        gather: concatenates a tensor over processes (accelerate's ``gather``).
        reduce_sum: sums a tensor over processes.
        device: where this process's sums are made.
        reward_names: the reward functions' names, in their order.
        answer_checker: ``(text, answer) -> bool``, regrades every answering role's outputs against the rows'
            ``answer`` column (None: no regrading).
    """

    def __init__(
        self,
        workflow: Workflow,
        *,
        record: Record,
        record_column: Callable[[str, list], None],
        gather: Callable[[torch.Tensor], torch.Tensor],
        reduce_sum: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device,
        reward_names: Sequence[str],
        answer_checker: Callable[[str, Any], bool] | None = None,
    ):
        self.workflow, self.roles = workflow, workflow.roles
        self.record, self.record_column = record, record_column
        self.gather, self.reduce_sum, self.device = gather, reduce_sum, device
        self.reward_names, self.answer_checker = list(reward_names), answer_checker

    def workflow_batch(self, mode: str, episodes: Sequence, rows: list[dict], *, rewards: list[float]) -> dict:
        """This process's episodes (``rewards``: their outcome rewards) read by what the workflow declares, and each
        role's outputs as a column of TRL's completions table (``log_completions``). Returns what was recorded."""
        checker = self.answer_checker if self.answer_checker and "answer" in rows[0] else None
        kept = [i for i, e in enumerate(episodes) if not e.dropped]  # a dropped episode made no call to read
        answers = [rows[i]["answer"] for i in kept] if checker else None
        values = workflow_metrics(
            self.workflow, [episodes[i] for i in kept], [rewards[i] for i in kept], checker, answers
        )
        values.pop("workflow/success", None)  # logged from the rewards of every process already
        self.record(mode, values)
        for role in self.roles:
            column = ["\n---\n".join(c.text for c in e.calls if c.role == role) for e in episodes]
            self.record_column(f"role/{role}", column)
        return values

    def rollout_batch(
        self, mode: str, episodes: Sequence, batch, *, rewards, rewards_per_func, tool_roles: Sequence[str] | None
    ) -> int:
        """Each role's samples of a generation batch (lengths, truncation, advantages), the rewards, calls per episode
        and, unless ``tool_roles`` is None, the tool calls (of those roles, and over every role). Returns the tokens
        the batch holds over every process (prompts and completions), for the Trainer's ``num_input_tokens_seen``."""
        tokens = batch.completion_mask.sum(dim=1)
        calls = self.gather(torch.tensor([float(len(e.calls)) for e in episodes], device=self.device))
        sums = role_metrics.rollout_sums(
            self.roles, batch.roles, completion_tokens=tokens, truncated=batch.truncated, advantages=batch.advantages
        )
        values = role_metrics.rollout_metrics(
            self.roles,
            self.gather(sums[None]).sum(0),
            rewards=rewards,
            rewards_per_func=rewards_per_func,
            reward_names=self.reward_names,
            calls_per_episode=calls,
            batch=batch,
        )
        self.record(mode, values)
        if tool_roles is not None:
            tool_sums = self.gather(role_metrics.tool_sums(tool_roles, episodes, self.device)[None]).sum(0)
            self.record(mode, role_metrics.tool_metrics(tool_roles, tool_sums, len(calls)))
        return int(self.gather((batch.prompt_mask.sum() + tokens.sum()).view(1)).sum().item())

    def role_rewards(self, mode: str, episodes: Sequence, values: list[list[float]]) -> None:
        """Each role's mean per-role reward over every process."""
        sums = role_metrics.role_reward_sums(self.roles, episodes, role_rewards=values, device=self.device)
        self.record(mode, role_metrics.role_reward_metrics(self.roles, self.gather(sums[None]).sum(0)))

    def loss_forward(self, mode: str, batch, *, logps, entropies, epsilon_low: float, epsilon_high: float) -> None:
        """Each role's token statistics of one loss forward (log-probs, entropies, the share clipped)."""
        sums = role_metrics.token_stat_sums(
            self.roles, batch, logps=logps, entropies=entropies, epsilon_low=epsilon_low, epsilon_high=epsilon_high
        )
        self.record(mode, role_metrics.token_stat_metrics(self.roles, self.reduce_sum(sums)))

    def role_kl(self, mode: str, batch, per_token_kl: torch.Tensor) -> None:
        """Each role's KL to the base model in one loss forward."""
        kl = role_metrics.role_kl_metrics(
            self.roles, batch.roles, per_token_kl=per_token_kl, mask=batch.completion_mask
        )
        self.record(mode, kl)

    def mini_batch_updates(self, plan: Sequence[str], adapters: Sequence[str], samples: float) -> None:
        """A training step's mini-batch updates (`update_schedule="mini_batches"`): each adapter's optimizer steps
        (``plan``: the adapter of each mini-batch, in order) and the samples trained."""
        steps = {f"adapter/{a}/optimizer_steps": float(sum(b == a for b in plan)) for a in adapters}
        self.record("train", {**steps, "workflow/samples_trained": samples})

    def updates(self, measured: Sequence, role_adapters: Mapping[str, str]) -> None:
        """Each adapter's and role's gradient of an optimizer step, as the adapters measured it."""
        self.record("train", role_metrics.update_metrics(measured, dict(role_adapters)))
