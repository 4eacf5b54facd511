"""The judged best-of-n baseline: n samples of a single agent, each judged by a trained Eval-Opt evaluator.

The cost-matched baseline of a workflow with a judge: SA-RL sampled n times per episode (n the workflow's measured
calls per episode, rounded up, as for the majority vote) and the answer chosen by the same judge the workflow trained.
Each sample is shown to the judge exactly as that workflow's evaluator sees a first attempt
(``EvalOpt.review_request``: under the shared history, the generator's request, the sample as its answer and the
evaluate request), and ``best_of.judged_choice`` takes the majority answer among the samples judged
``\\boxed{Correct}`` (none: among all). An episode makes ``2 n`` calls: the n samples, then n verdicts. What the
judge sees is never the sampler's own prompt: the sample is judged as the workflow's attempt would be.

``Judge.plan`` turns an evaluation of an SA-RL checkpoint into one of ``JudgedSamples``: its own adapter samples,
the judge run's ``evaluator`` adapter judges (loaded beside it on the same base model).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..checkpoints import read_multiagent_config, workflow_from_config
from ..rollout.records import Episode
from ..workflows import EvalOpt, SingleAgent, Workflow
from ..workflows.base import Generate, Messages
from ..workflows.correctness import solved
from .best_of import judged_choice
from .modes import ModePlan, apply_role_policies
from .run_checkpoints import list_checkpoints


class JudgedSamples(Workflow):
    """``n`` concurrent samples of ``sampler`` (instances ``0 .. n - 1`` of its ``generator``), then one
    ``evaluator`` call per sample (instance i judges sample i) with ``judge``'s first-review request; the final answer
    is the sample ``judged_choice`` picks.

    Args:
        sampler: the single agent whose answers are sampled (an SA-RL run's own ``SingleAgent``).
        judge: the Eval-Opt workflow whose evaluator judges (its prompts, history and verdict rule).
        n: samples per episode.
    """

    roles = ("generator", "evaluator")

    def __init__(self, sampler: SingleAgent, judge: EvalOpt, n: int) -> None:
        if not isinstance(sampler, SingleAgent):
            raise ValueError(f"JudgedSamples samples a single agent; got {type(sampler).__name__}.")
        if not isinstance(judge, EvalOpt):
            raise ValueError(
                f"JudgedSamples judges with an Eval-Opt evaluator's first review; got {type(judge).__name__}, "
                "which has no role that judges one answer."
            )
        if n < 1:
            raise ValueError(f"JudgedSamples needs n >= 1 samples, got {n}.")
        self.sampler, self.judge, self.n = sampler, judge, n

    @property
    def formats(self):
        return {"generator": self.sampler.formats["generator"], "evaluator": self.judge.formats["evaluator"]}

    @property
    def parallel(self):
        return {"generator": self.n, "evaluator": self.n}

    def config_dict(self) -> dict[str, Any]:
        return {
            "workflow": type(self).__name__,
            "sampler": self.sampler.config_dict(),
            "judge": self.judge.config_dict(),
            "n": self.n,
        }

    async def run(self, prompt: Messages, generate: Generate) -> str:
        samples = list(
            await asyncio.gather(*(self.sampler.run(prompt, _as_instance(generate, i)) for i in range(self.n)))
        )
        reviews = await asyncio.gather(
            *(
                generate("evaluator", self.judge.review_request(prompt, sample), instance=i)
                for i, sample in enumerate(samples)
            )
        )
        answer, verdict = self.formats["generator"], self.formats["evaluator"]
        return samples[judged_choice([answer.parse(s) for s in samples], [verdict.read(r) for r in reviews])]


def _as_instance(generate: Generate, fixed: int) -> Generate:
    """``generate`` with every call made as instance ``fixed`` (the sampler calls its one agent as instance 0)."""

    async def at_instance(role: str, messages: Messages, *, instance: int = 0) -> str:
        return await generate(role, messages, instance=fixed)

    return at_instance


def judged_samples(
    reward_func: Callable, episodes: list[Episode], rows: list[dict[str, Any]], workflow: JudgedSamples
) -> tuple[list[bool], list[bool]]:
    """Per sample of each episode (episode-major, by instance): whether the task's reward solves it, and whether the
    judge accepted it (its verdict read with the judge's rule)."""
    samples, verdicts, sample_rows = [], [], []
    for episode, row in zip(episodes, rows):
        by_role = {
            role: sorted((c for c in episode.calls if c.role == role), key=lambda c: c.instance)
            for role in workflow.roles
        }
        samples += [call.text for call in by_role["generator"]]
        verdicts += [workflow.formats["evaluator"].read(call.text) for call in by_role["evaluator"]]
        sample_rows += [row] * len(by_role["generator"])
    columns = {name: [row[name] for row in sample_rows] for name in sample_rows[0] if name != "prompt"}
    rewards = reward_func(
        prompts=[row["prompt"] for row in sample_rows],
        completions=[[{"role": "assistant", "content": text}] for text in samples],
        **columns,
    )
    return [solved(0.0 if r is None or math.isnan(r) else r) for r in rewards], verdicts


@dataclass(frozen=True)
class Judge:
    """The judge of a judged best-of-n: an Eval-Opt run's newest checkpoint (resolved), its step and its saved
    configuration, read once per evaluation."""

    checkpoint: Path
    step: int
    config: dict[str, Any]

    @classmethod
    def of(cls, judge: str | Path) -> Judge:
        """A run folder's newest checkpoint (or the checkpoint itself), checked to hold a trained Eval-Opt
        evaluator."""
        step, checkpoint = list_checkpoints(judge)[-1]
        config = read_multiagent_config(checkpoint)
        trained = workflow_from_config(config["workflow"])
        if not isinstance(trained, EvalOpt):
            raise ValueError(
                f"--judge {judge} was trained as {type(trained).__name__}; the judge must be an Eval-Opt run, whose "
                "evaluator judges one answer."
            )
        return cls(Path(checkpoint).resolve(), step, config)

    def record(self) -> dict[str, Any]:
        """What a judged row records of its judge: the run, workflow, policy sharing and step of its checkpoint."""
        run = self.checkpoint.parent if self.checkpoint.name.startswith("checkpoint-") else self.checkpoint
        return {
            "run": run.name,
            "workflow": self.config["workflow"]["workflow"],
            "policy_sharing": self.config["policy_sharing"],
            "step": self.step,
        }

    def plan(self, plan: ModePlan, n: int) -> ModePlan:
        """``plan`` (an SA-RL checkpoint in trained mode) as a ``JudgedSamples`` evaluation: the run's adapter
        samples, this checkpoint's ``evaluator`` adapter judges."""
        if plan.mode != "trained" or not isinstance(plan.workflow, SingleAgent) or plan.role_policies:
            raise ValueError(
                "A judged best-of-n samples a single-agent run's own adapter: evaluate a SingleAgent (SA-RL) run in "
                f"trained mode without role_policies (got {plan.mode} mode, {type(plan.workflow).__name__})."
            )
        eval_opt = workflow_from_config(self.config["workflow"])
        mapping, folders = apply_role_policies(plan.role_to_adapter, {"evaluator": str(self.checkpoint)}, plan.model)
        return replace(
            plan,
            workflow=JudgedSamples(plan.workflow, eval_opt, n),
            role_to_adapter=mapping,
            adapter_folders={**plan.adapter_folders, **folders},
        )
