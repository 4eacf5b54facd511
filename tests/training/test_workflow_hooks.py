"""The workflow hooks training reads, as a user's workflow declares them: ``role_reward_policy`` (what the built-in
per-role rewards grade each role by) and ``group_key`` (which calls form a GRPO group under
``advantage_groups="calls"``). The built-in workflows' reference choices are tested against the reference in
test_role_rewards.py and test_advantage_groups.py."""

from __future__ import annotations

import pytest
import torch
from scripted import boxed_answer_reward
from user_workflows import DraftCritic

from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.advantages import call_advantages, group_advantages
from trl_multiagent.training.role_rewards import builtin_role_rewards, outcome_scorer
from trl_multiagent.workflows import RoleRewardPolicy

ROWS = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}]
SCORE = outcome_scorer([boxed_answer_reward], [1.0])


def call(role: str, text: str = "", instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [{"role": "user", "content": "q"}], [1], [2], text, False)


class CriticByOutcome(DraftCritic):
    """The critic graded against the episode's final answer, the drafter's calls by their own answers."""

    role_reward_policy = RoleRewardPolicy({"critic": "outcome"})


class DraftsApart(DraftCritic):
    """Each draft of an episode compared only with the same draft of the prompt's other episodes."""

    def group_key(self, role: str, instance: int) -> str:
        return f"{role}{instance}"


# A wrong draft the critic rightly rejects, then a right rewrite: the episode's outcome is right.
EPISODE = Episode(
    0, [call("drafter", "\\boxed{5}"), call("critic", "\\boxed{Incorrect}"), call("drafter", "\\boxed{4}")]
)


def test_a_users_reward_policy_decides_what_its_roles_are_graded_by():
    # Own output (the default): the critic judged the wrong draft right.
    assert builtin_role_rewards("reference", DraftCritic(), [EPISODE], ROWS, [1.0], SCORE) == [[0.0, 1.0, 1.0]]
    # By the outcome: the final answer is right, so "Incorrect" is a wrong verdict.
    assert builtin_role_rewards("reference", CriticByOutcome(), [EPISODE], ROWS, [1.0], SCORE) == [[0.0, 0.0, 1.0]]
    # "own_answers" grades every role by its own output, whatever the policy.
    assert builtin_role_rewards("own_answers", CriticByOutcome(), [EPISODE], ROWS, [1.0], SCORE) == [[0.0, 1.0, 1.0]]
    zeroed = RoleRewardPolicy({"drafter": "zero"})
    assert zeroed.source("drafter") == "zero" and zeroed.source("critic") == "own"


def test_a_policy_names_a_known_source():
    with pytest.raises(ValueError, match="own.*outcome.*zero"):
        RoleRewardPolicy({"critic": "final"})


def test_a_users_group_key_decides_which_calls_are_compared():
    # One prompt, 2 episodes, each a draft of instance 0 and one of instance 1: instance 0 always right, 1 never.
    episodes = [Episode(i, [call("drafter", instance=0), call("drafter", instance=1)]) for i in range(2)]
    rewards = torch.tensor([1.0, 1.0])
    role_rewards = [[1.0, 0.0], [1.0, 0.0]]

    def advantages(workflow) -> list[float]:
        return call_advantages(
            episodes,
            first_episode=0,
            episode_advantages=group_advantages(rewards, 2),
            rewards=rewards,
            group_key=workflow.group_key,
            num_generations=2,
            scale_rewards="group",
            groups="calls",
            gather_object=lambda x: x,
            role_rewards=role_rewards,
        )

    together = 0.5 / (torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item() + 1e-6)  # one group of the 4 drafts
    assert advantages(DraftCritic()) == pytest.approx([together, -together, together, -together])
    assert advantages(DraftsApart()) == [0.0, 0.0, 0.0, 0.0]  # each group alike: nothing to learn from
