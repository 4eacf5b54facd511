"""Step 2 of a training step: a generation batch's episodes scored, and their outcome rewards made GRPO advantages.

The reward functions score each episode's final answer (as TRL scores a completion; the trainer's hook gathers the
scores over processes); an episode that a prompt too long ended counts in no group; the functions' outputs are then
aggregated and normalised over the episodes of each prompt as TRL's ``multi_objective_aggregation`` says
(advantages.py). No model runs here: what scores the answers is passed in, so the arithmetic is tested alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .advantages import outcome_advantages, weighted_rewards
from .early_rewards import final_completion_ids, final_completions

# (rows, completions, completion ids) -> `[E_all, F]` each reward function's score of every process's episodes
ScoreAnswers = Callable[[list[dict], list, list[list[int]]], torch.Tensor]


@dataclass(frozen=True)
class EpisodeRewards:
    """What step 2 hands step 3 and the step's metrics, over every process's episodes (`E_all`, gathered)."""

    per_func: torch.Tensor  # [E_all, F] each reward function's score; NaN: not scored, or the episode dropped
    rewards: torch.Tensor  # [E_all] the reward the advantages come from (the functions aggregated)
    advantages: torch.Tensor  # [E_all] each episode's GRPO advantage among its prompt's episodes
    logged: torch.Tensor  # [E_all] what TRL logs as `reward`: the weighted sum of the functions' scores
    first: int  # this process's first episode in the gathered tensors
    count: int  # this process's episodes
    dropped: float | None  # episodes a prompt too long ended, over every process; None without a prompt limit

    def local(self, values: torch.Tensor) -> list[float]:
        """This process's share of an `[E_all]` tensor."""
        return values[self.first : self.first + self.count].tolist()


def episode_rewards(
    episodes: Sequence,
    rows: list[dict],
    *,
    score: ScoreAnswers,
    reward_weights: torch.Tensor,
    num_generations: int,
    scale_rewards: str,
    aggregation: str,
    process_index: int,
    count_dropped: bool,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> EpisodeRewards:
    """The outcome rewards and advantages of this process's ``episodes`` (one per row of ``rows``; every process
    holds as many), ``score`` giving every process's scores. With ``count_dropped`` (a prompt limit is set) an episode
    that a prompt too long ended scores NaN, so that it counts in no group and gets advantage 0."""
    completions = final_completions(episodes, rows)
    per_func = score(rows, completions, [final_completion_ids(e) for e in episodes]).clone()
    dropped = None
    if count_dropped:
        ended = gather(torch.tensor([float(e.dropped) for e in episodes], device=per_func.device))
        per_func[ended.bool()] = torch.nan
        dropped = ended.sum().item()
    rewards, advantages = outcome_advantages(
        per_func, reward_weights, num_generations=num_generations, scale_rewards=scale_rewards, aggregation=aggregation
    )
    return EpisodeRewards(
        per_func=per_func,
        rewards=rewards,
        advantages=advantages,
        logged=weighted_rewards(per_func, reward_weights),  # as TRL logs it, under either aggregation
        first=process_index * len(episodes),
        count=len(episodes),
        dropped=dropped,
    )
