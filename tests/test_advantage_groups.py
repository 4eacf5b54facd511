"""GRPO groups: one per prompt over whole episodes (default), or the reference's per prompt, role and instance."""

from __future__ import annotations

import math

import pytest
import torch

from trl_multiagent import OrchWorkers
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.advantages import call_advantages, group_advantages, trajectory_advantages


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
    args = (rewards, OrchWorkers().trajectory_name, 2, "group")
    by_episode = call_advantages(episodes, 0, per_episode, *args, "episodes", lambda x: x)
    by_role = call_advantages(episodes, 0, per_episode, *args, "roles", lambda x: x)
    assert by_episode == pytest.approx([per_episode[0].item()] * 4 + [per_episode[1].item()] * 3)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert by_role == pytest.approx([a, a, a, 0.0, -a, -a, -a])  # worker 2 has no group to compare with
