"""Rewards that take work (running programs in the sandbox) score each episode as soon as it ends.

A reward function that sets ``scores_each_episode = True`` (``CodeReward`` does) is called once per episode, on a
worker thread, the moment the rollout engine reports the episode finished, while the other episodes still generate.
When TRL's reward step then calls it with the whole batch, it hands back those scores in row order (and replays what
the per-episode calls logged through ``log_extra`` / ``log_metric``, in row order too). The batch it is called with
must be the one it scored, completion for completion; anything else is an error, never a silent rescoring.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
from collections.abc import Callable
from typing import Any

from trl import is_conversational


def final_completions(episodes, rows: list[dict]) -> list:
    """What the outcome reward scores: each episode's final answer, as an assistant message for conversational rows.

    When a role with tools gave the answer (``Episode.answering_conversation``), the completion is that `generate`'s
    whole conversation, as TRL's ``GRPOTrainer(tools=...)`` passes it: each model call's parsed assistant message
    (with its ``tool_calls``), followed by the ``tool`` messages of its calls.
    """
    completions = []
    for episode, row in zip(episodes, rows):
        conversation = episode.answering_conversation()
        if not is_conversational(row):
            completions.append(episode.final_answer)
        elif conversation is not None:
            completions.append(copy.deepcopy(conversation.messages))  # a reward may edit its inputs
        else:
            completions.append([{"role": "assistant", "content": episode.final_answer}])
    return completions


def final_completion_ids(episode) -> list[int]:
    """The reward functions' ``completion_ids`` of an episode: its last call's completion, or, when a role with tools
    gave the answer, every token after that `generate`'s first prompt (completions and tool turns), as TRL's."""
    conversation = episode.answering_conversation()
    if conversation is not None:
        return list(conversation.completion_ids)
    return episode.calls[-1].completion_ids if episode.calls else []


def _key(prompts: list) -> str:
    return json.dumps(prompts, sort_keys=True, default=str)


class EpisodeScored:
    """Stands in for one reward function in the trainer's ``reward_funcs``: TRL's call collects the scores of the
    episodes its batch holds."""

    def __init__(self, func: Callable, pool: concurrent.futures.ThreadPoolExecutor):
        self.func, self.pool = func, pool
        self.__name__ = getattr(func, "__name__", type(func).__name__)
        self.jobs: dict[str, list[concurrent.futures.Future | None]] = {}

    def start(self, key: str, size: int) -> list:
        self.jobs[key] = [None] * size
        return self.jobs[key]

    def score(self, row: dict, episode, *, completion, state) -> tuple[float, list, list]:
        logged_extra, logged_metrics = [], []
        columns = {k: [v] for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}
        (value,) = self.func(
            prompts=[row["prompt"]],
            completions=[completion],
            completion_ids=[final_completion_ids(episode)],
            trainer_state=state,
            log_extra=lambda column, values: logged_extra.append((column, values)),
            log_metric=lambda name, value: logged_metrics.append((name, value)),
            **columns,
        )
        return value, logged_extra, logged_metrics

    def __call__(self, prompts, completions, *, log_extra=None, log_metric=None, **kwargs) -> list[float]:
        futures = self.jobs.pop(_key(prompts), None)
        if futures is None or len(futures) != len(completions) or any(f is None for f in futures):
            raise RuntimeError(
                f"Reward {self.__name__!r} scores each episode as it ends, and the batch it is called with is not "
                "one whose episodes it scored. It can only be called by the trainer's reward step."
            )
        values = []
        for future, completion in zip(futures, completions):
            value, extra, metrics, scored = future.result()
            if scored != completion:
                raise RuntimeError(f"Reward {self.__name__!r} scored {scored!r} but is asked about {completion!r}.")
            for column, logged in extra:
                log_extra(column, logged)
            for name, logged in metrics:
                log_metric(name, logged)
            values.append(value)
        return values


class EarlyRewards:
    """Wraps the reward functions that ``scores_each_episode`` (replaced in ``reward_funcs``, the trainer's list, in
    place); ``run`` runs a rollout that starts their scoring as each episode ends. ``trainer_state`` returns the
    trainer's current ``TrainerState`` (the reward functions' ``trainer_state`` argument)."""

    def __init__(self, reward_funcs: list, trainer_state: Callable[[], Any], max_workers: int = 8):
        self.trainer_state = trainer_state
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="episode-reward")
        for i, func in enumerate(reward_funcs):
            if getattr(func, "scores_each_episode", False):
                reward_funcs[i] = EpisodeScored(func, self.pool)
        self.scored = [f for f in reward_funcs if isinstance(f, EpisodeScored)]

    def run(self, rows: list[dict], run_episodes: Callable[..., list]) -> list:
        prompts = [row["prompt"] for row in rows]
        if not self.scored:
            return run_episodes(prompts)
        key = _key(prompts)
        slots = [scored.start(key, len(rows)) for scored in self.scored]

        def episode_done(episode) -> None:
            row = rows[episode.index]
            (completion,) = final_completions([episode], [row])
            for scored, futures in zip(self.scored, slots):
                job = self._job(scored, row, episode, completion=completion)
                futures[episode.index] = self.pool.submit(job)

        return run_episodes(prompts, on_episode_end=episode_done)

    def _job(self, scored: EpisodeScored, row: dict, episode, *, completion) -> Callable[[], Any]:
        state = self.trainer_state()

        def job():
            return (*scored.score(row, episode, completion=completion, state=state), completion)

        return job
