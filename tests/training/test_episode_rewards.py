"""Step 2 alone (training/episode_rewards.py): episodes in, outcome rewards and GRPO advantages out, with a scoring
function standing in for the trainer's reward functions; no model, no trainer."""

from __future__ import annotations

import pytest
import torch

from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.training.episode_rewards import episode_rewards


def episode(index: int, answer: str, *, dropped: bool = False) -> Episode:
    call = ModelCall("generator", 0, "generator", [{"role": "user", "content": "q"}], [1], [7, index], answer, False)
    return Episode(index, [] if dropped else [call], final_answer="" if dropped else answer, dropped=dropped)


ROWS = [{"prompt": [{"role": "user", "content": f"What is {i // 4} + 1?"}]} for i in range(8)]


def scored_by(values: list[list[float]], seen: list | None = None):
    """A scoring function returning ``values`` (`[E_all, F]`), recording what it was asked to score."""

    def score(rows, completions, completion_ids):
        if seen is not None:
            seen.append((rows, completions, completion_ids))
        return torch.tensor(values)

    return score


def rewards_of(episodes, values, *, process_index=0, count_dropped=False, weights=(1.0,), seen=None, **settings):
    return episode_rewards(
        episodes,
        ROWS[: len(episodes)],
        score=scored_by(values, seen),
        reward_weights=torch.tensor(weights),
        num_generations=settings.get("num_generations", 4),
        scale_rewards=settings.get("scale_rewards", "group"),
        aggregation=settings.get("aggregation", "sum_then_normalize"),
        process_index=process_index,
        count_dropped=count_dropped,
        gather=lambda t: t,  # one process
    )


def test_each_prompts_episodes_form_a_group():
    """Two prompts, four episodes each: an episode's advantage is its reward against its own group's mean and std."""
    episodes = [episode(i, f"\\boxed{{{i}}}") for i in range(8)]
    values = [[1.0], [0.0], [0.0], [0.0], [1.0], [1.0], [1.0], [0.0]]
    rewards = rewards_of(episodes, values)
    groups = torch.tensor(values).view(2, 4)
    expected = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(rewards.advantages, expected.view(-1))
    assert rewards.rewards.tolist() == [v for (v,) in values]
    assert rewards.dropped is None  # no prompt limit: nothing counted


def test_the_functions_score_each_final_answer_and_are_weighted():
    """The scoring function gets every episode's final answer as an assistant message (conversational rows) and its
    last call's completion ids; two functions at weights 2 and 1 make the reward and TRL's logged `reward`."""
    episodes = [episode(i, f"answer {i}") for i in range(4)]
    seen = []
    values = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    rewards = rewards_of(episodes, values, weights=(2.0, 1.0), seen=seen)
    (rows, completions, ids), *_ = seen
    assert completions == [[{"role": "assistant", "content": f"answer {i}"}] for i in range(4)]
    assert ids == [[7, i] for i in range(4)] and rows == ROWS[:4]
    assert rewards.logged.tolist() == rewards.rewards.tolist() == [2.0, 1.0, 3.0, 0.0]


def test_a_dropped_episode_scores_nothing_and_counts_in_no_group():
    """Under a prompt limit, an episode a prompt too long ended gets NaN from every function and advantage 0, and its
    group's statistics are the other three's; the step counts it."""
    episodes = [episode(0, "a"), episode(1, "", dropped=True), episode(2, "c"), episode(3, "d")]
    values = [[1.0], [1.0], [0.0], [0.0]]
    rewards = rewards_of(episodes, values, count_dropped=True)
    assert rewards.dropped == 1
    assert torch.isnan(rewards.per_func[1]).all() and rewards.advantages[1] == 0
    rest = torch.tensor([1.0, 0.0, 0.0])
    expected = (rest - rest.mean()) / (rest.std() + 1e-4)
    torch.testing.assert_close(rewards.advantages[[0, 2, 3]], expected)


def test_a_process_reads_its_own_share_of_the_gathered_rewards():
    """With two processes of four episodes each, the second's episodes are the gathered tensors' last four."""
    episodes = [episode(i, "x") for i in range(4)]
    values = [[float(i)] for i in range(8)]  # every process's scores, gathered
    rewards = rewards_of(episodes, values, process_index=1)
    assert (rewards.first, rewards.count) == (4, 4)
    assert rewards.local(rewards.rewards) == [4.0, 5.0, 6.0, 7.0]


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_an_episode_no_function_scored_gets_advantage_zero(aggregation):
    episodes = [episode(i, "x") for i in range(4)]
    values = [[float("nan")], [1.0], [0.0], [1.0]]
    rewards = rewards_of(episodes, values, aggregation=aggregation)
    assert rewards.advantages[0] == 0 and torch.isnan(rewards.rewards[0])
