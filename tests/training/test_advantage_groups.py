"""GRPO groups: one per prompt over whole episodes (default), the reference's per prompt and trajectory name with
every call a sample (`calls`, the paper preset), or per prompt, role and instance with calls pooled (`roles`)."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from reference_rules import reference_advantages, verl_grpo

from trl_multiagent import EvalOpt, OrchWorkers, Voting
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.advantages import (
    call_advantages,
    call_group_advantages,
    group_advantages,
    trajectory_advantages,
)


def test_trajectory_groups_are_per_prompt_role_and_instance():
    # 2 prompts x 2 episodes; role 0 has two instances, role 1 one; episode 3's instance 1 is missing.
    trajectories = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0), (3, 0, 0)]
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.5, float("nan")]
    got = trajectory_advantages(trajectories, rewards, num_generations=2)
    half = 0.5 / (math.sqrt(0.5) + 1e-6)  # two values 1 and 0: mean 0.5, unbiased std sqrt(0.5)
    assert got[:6] == pytest.approx([half, -half, half, -half, half, -half], abs=1e-9)
    assert got[6:] == [0.0, 0.0]  # prompt 1's group: one scorable trajectory (episode 3 unscorable)


def call(role: str, instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [], [1], [2], "", False)


def test_a_role_missing_from_some_episodes_differs_between_groupings():
    # Orch-Workers-like: episode 0 ran 3 workers, episode 1 only 2 (one strategy parsed fewer).
    episodes = [
        Episode(0, [call("orchestrator"), call("worker", 0), call("worker", 1), call("worker", 2)]),
        Episode(1, [call("orchestrator"), call("worker", 0), call("worker", 1)]),
    ]
    rewards = torch.tensor([1.0, 0.0])
    per_episode = group_advantages(rewards, 2)
    same = dict(
        first_episode=0,
        episode_advantages=per_episode,
        rewards=rewards,
        group_key=OrchWorkers().group_key,
        num_generations=2,
        scale_rewards="group",
        gather_object=lambda x: x,
    )
    by_episode = call_advantages(episodes, groups="episodes", **same)
    by_role = call_advantages(episodes, groups="roles", **same)
    assert by_episode == pytest.approx([per_episode[0].item()] * 4 + [per_episode[1].item()] * 3)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert by_role == pytest.approx([a, a, a, 0.0, -a, -a, -a])  # worker 2 has no group to compare with


def outcome_per_call(episodes, rewards) -> list[float]:
    """The outcome broadcast to every call (the reference's use_final_outcome_reward=True)."""
    return [float(rewards[e.index]) for e in episodes for _ in e.calls]


def eval_opt_episode(index: int, attempts: int) -> Episode:
    return Episode(index, [call(role) for _ in range(attempts) for role in ("generator", "evaluator")])


def advantages(episodes, workflow, rewards, num_generations, groups, **kwargs):
    per_episode = group_advantages(rewards, num_generations)
    return call_advantages(
        episodes,
        first_episode=0,
        episode_advantages=per_episode,
        rewards=rewards,
        group_key=workflow.group_key,
        num_generations=num_generations,
        scale_rewards="group",
        groups=groups,
        gather_object=lambda x: x,
        **kwargs,
    )


def test_calls_grouping_is_the_references_on_the_eval_opt_worked_example():
    # One prompt, 8 episodes: 4 right at the first attempt (generator, evaluator), 4 wrong after 3 attempts.
    episodes = [eval_opt_episode(i, 1) for i in range(4)] + [eval_opt_episode(i, 3) for i in range(4, 8)]
    rewards = torch.tensor([1.0] * 4 + [0.0] * 4)
    got = advantages(episodes, EvalOpt(), rewards, 8, "calls")
    expected = reference_advantages(episodes, 8, "eval_opt", outcome_per_call(episodes, rewards))
    assert got == pytest.approx(expected, abs=1e-9)
    roles = [c.role for e in episodes for c in e.calls]
    generator = [a for a, role in zip(got, roles) if role == "generator"]
    assert generator[:4] == pytest.approx([1.677] * 4, abs=1e-3)  # 16 calls: 4 right, 12 wrong
    assert generator[4:] == pytest.approx([-0.559] * 12, abs=1e-3)
    assert sum(generator) == pytest.approx(0.0, abs=1e-6)
    # `roles` pools each episode's calls first: +-0.935 per call, so the failing episodes' 12 calls outweigh.
    pooled = [a for a, role in zip(advantages(episodes, EvalOpt(), rewards, 8, "roles"), roles) if role == "generator"]
    assert pooled == pytest.approx([0.935] * 4 + [-0.935] * 12, abs=1e-3)
    assert sum(pooled) == pytest.approx(-7.48, abs=1e-2)


@pytest.mark.parametrize("task", ["math", "code"])
def test_math_voters_are_a_group_each_and_code_voters_one_group(task):
    # 2 prompts x 4 episodes of 3 voters and an aggregator, with per-role rewards: voter 0 is always right, voter 1
    # right in even episodes, voter 2 never; the aggregator as the outcome.
    episodes = [
        Episode(i, [call("generator", 0), call("generator", 1), call("generator", 2), call("aggregator")])
        for i in range(8)
    ]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5])
    role_rewards = [[1.0, float(i % 2 == 0), 0.0, float(rewards[i])] for i in range(8)]
    for weight in (0.0, 1.0):  # outcome rewards, then the per-role ones
        got = advantages(
            episodes, Voting(task=task), rewards, 4, "calls", role_rewards=role_rewards, role_reward_weight=weight
        )
        scores = outcome_per_call(episodes, rewards) if weight == 0 else [r for rs in role_rewards for r in rs]
        assert got == pytest.approx(reference_advantages(episodes, 4, f"voting_{task}", scores), abs=1e-9)
    voter0 = got[0::4]
    # Math: voter 0's group holds only its own right answers (advantage 0); code: all voters' answers, so it gains.
    assert voter0 == (pytest.approx([0.0] * 8) if task == "math" else pytest.approx([voter0[0]] * 8))
    assert task == "math" or voter0[0] > 0.5


def test_orch_workers_workers_form_one_group_per_prompt():
    # One prompt, 4 episodes with 3, 1, 2 and 3 workers: 9 worker calls, one group.
    sizes = [3, 1, 2, 3]
    episodes = [
        Episode(i, [call("orchestrator")] + [call("worker", k) for k in range(n)] + [call("synthesizer")])
        for i, n in enumerate(sizes)
    ]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    got = advantages(episodes, OrchWorkers(), rewards, 4, "calls")
    assert got == pytest.approx(reference_advantages(episodes, 4, "orch_workers", outcome_per_call(episodes, rewards)))
    workers = [a for a, c in zip(got, (c for e in episodes for c in e.calls)) if c.role == "worker"]
    # 9 samples, 5 right (3 + 2) and 4 wrong: mean 5/9, unbiased std over the 9, not over the 4 episodes.
    std = math.sqrt((5 * (4 / 9) ** 2 + 4 * (5 / 9) ** 2) / 8)
    right, wrong = (4 / 9) / (std + 1e-6), -(5 / 9) / (std + 1e-6)
    assert workers == pytest.approx([right] * 3 + [wrong] + [right] * 2 + [wrong] * 3, abs=1e-9)


def test_a_group_of_one_keeps_its_raw_score():
    # One episode per prompt (num_generations=1): each role's call is alone in its group.
    episodes = [
        Episode(0, [call("generator", k) for k in range(3)] + [call("aggregator")]),
        Episode(1, [call("generator", k) for k in range(3)] + [call("aggregator")]),
    ]
    rewards = torch.tensor([1.0, 0.0])
    got = advantages(episodes, Voting(), rewards, 1, "calls")
    assert got == pytest.approx(reference_advantages(episodes, 1, "voting_math", outcome_per_call(episodes, rewards)))
    assert got == pytest.approx([1 / (1 + 1e-6)] * 4 + [0.0] * 4, abs=1e-12)
    assert advantages(episodes, Voting(), rewards, 1, "roles") == [0.0] * 8  # pooled groups of one get 0
    # An unscorable sample (NaN) is left out: the one scorable sample left keeps its raw score, the NaN gets 0.
    assert call_group_advantages([0, 0, 1, 1, 1], [0.7, float("nan"), 1.0, 0.0, 1.0]) == pytest.approx(
        [0.7 / (1 + 1e-6), 0.0] + verl_grpo(["a"] * 3, [1.0, 0.0, 1.0]), abs=1e-12
    )


def test_per_role_rewards_under_calls_are_each_calls_own():
    # Eval-Opt, one prompt: per-role rewards differ between an episode's calls (attempt 1 wrong, attempt 2 right).
    episodes = [eval_opt_episode(0, 2), eval_opt_episode(1, 1), eval_opt_episode(2, 2), eval_opt_episode(3, 1)]
    role_rewards = [[0.0, 1.0, 1.0, 1.0], [1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0]]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    got = advantages(episodes, EvalOpt(), rewards, 4, "calls", role_rewards=role_rewards)
    flat = [r for per_episode in role_rewards for r in per_episode]
    expected = reference_advantages(episodes, 4, "eval_opt", flat)  # the reference's per-role variant: no outcome
    assert got == pytest.approx(expected, abs=1e-9)
    pooled = advantages(episodes, EvalOpt(), rewards, 4, "roles", role_rewards=role_rewards)
    assert pooled[0] == pytest.approx(pooled[2])  # pooled: episode 0's wrong and right attempt get one value
    assert got[0] < 0 < got[2]
    # role_reward_weight mixes advantages, both in the reference's groups (the reference itself mixes nothing).
    half = advantages(episodes, EvalOpt(), rewards, 4, "calls", role_rewards=role_rewards, role_reward_weight=0.5)
    outcome = reference_advantages(episodes, 4, "eval_opt", outcome_per_call(episodes, rewards))
    assert half == pytest.approx([(a + b) / 2 for a, b in zip(outcome, expected)], abs=1e-9)


class Collective:
    """``gather_object`` of ``n`` processes run as threads: each gets every process's objects, in process order."""

    def __init__(self, n: int):
        self.barrier, self.slots = threading.Barrier(n), [None] * n

    def gather_object(self, rank: int):
        def gather(objects):
            self.slots[rank] = list(objects)
            self.barrier.wait()
            every = [x for slot in self.slots for x in slot]
            self.barrier.wait()  # nobody overwrites a slot before everyone has read it
            return every

        return gather


@pytest.mark.parametrize("groups", ["calls", "roles"])
def test_groups_span_processes(groups):
    # One prompt's 8 Eval-Opt episodes split over two processes (4 each), with per-role rewards.
    episodes = [eval_opt_episode(i, 1 + i % 3) for i in range(8)]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    role_rewards = [[float((i + k) % 2) for k in range(len(e.calls))] for i, e in enumerate(episodes)]
    whole = advantages(episodes, EvalOpt(), rewards, 8, groups, role_rewards=role_rewards, role_reward_weight=0.7)
    collective, results = Collective(2), [None, None]

    def process(rank: int):
        mine = [Episode(i, e.calls) for i, e in enumerate(episodes[4 * rank : 4 * rank + 4])]
        results[rank] = call_advantages(
            mine,
            first_episode=4 * rank,
            episode_advantages=group_advantages(rewards, 8),
            rewards=rewards,
            group_key=EvalOpt().group_key,
            num_generations=8,
            scale_rewards="group",
            groups=groups,
            gather_object=collective.gather_object(rank),
            role_rewards=role_rewards[4 * rank : 4 * rank + 4],
            role_reward_weight=0.7,
        )

    threads = [threading.Thread(target=process, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] + results[1] == pytest.approx(whole, abs=1e-12)
    if groups == "calls":
        flat = [r for per_episode in role_rewards for r in per_episode]
        ref = reference_advantages(episodes, 8, "eval_opt", flat)
        out = reference_advantages(episodes, 8, "eval_opt", outcome_per_call(episodes, rewards))
        assert whole == pytest.approx([0.3 * a + 0.7 * b for a, b in zip(out, ref)], abs=1e-9)
