"""Rewards that take work (`scores_each_episode = True`, as CodeReward) score each episode the moment it ends, while
the other episodes still generate; TRL's reward step gets the same scores as a batch call would give."""

from __future__ import annotations

import re
import threading

import pytest
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from tiny import tiny_trainer
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt
from trl_multiagent.tasks.code import CodeReward
from trl_multiagent.training.early_rewards import EpisodeScored


def judged_by_parity(requests, rng) -> list[str]:
    """The generator answers; the evaluator accepts even problems at once, so those episodes end two ticks early."""
    outputs = []
    for request in requests:
        text = " ".join(m["content"] for m in request.messages)
        i = int(re.search(r"What is (\d+) \+ 2", text).group(1))
        judging = request.adapter == "evaluator"
        outputs.append(
            ("\\boxed{Correct}" if i % 2 == 0 else "\\boxed{Incorrect}") if judging else f"\\boxed{{{i + 2}}}"
        )
    return outputs


class RecordedBoxedReward:
    """`boxed_answer_reward`, recording each call (its size and thread) and writing "score" to a shared event log;
    ``two_scored`` is set once two episodes were scored."""

    scores_each_episode = True
    __name__ = "recorded_boxed"

    def __init__(self, events: list[str]):
        self.calls: list[tuple[int, str]] = []
        self.events = events
        self.two_scored = threading.Event()

    def __call__(self, completions, answer, **kwargs):
        self.calls.append((len(completions), threading.current_thread().name))
        self.events.append("score")
        if len(self.calls) >= 2:
            self.two_scored.set()
        kwargs["log_extra"]("scored", [f"row {a}" for a in answer])
        return boxed_answer_reward(completions, answer)


def test_each_episode_is_scored_as_it_ends_and_the_step_reads_those_scores(tiny_model_dir, tmp_path):
    events: list[str] = []
    scored = RecordedBoxedReward(events)
    backend = ScriptedBackend(AutoTokenizer.from_pretrained(tiny_model_dir), judged_by_parity)
    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        backend=backend,
        reward_funcs=[scored, boxed_answer_reward],
        dataset=addition_dataset(2),
        num_generations=2,
        policy_sharing="isolated",
        max_steps=1,
        save_strategy="no",
        log_completions=True,
        seed=0,
    )
    assert isinstance(trainer.reward_funcs[0], EpisodeScored) and trainer.reward_funcs[1] is boxed_answer_reward
    generate = backend.generate

    def logged_generate(requests):
        if events.count("tick") == 3:  # the even problems' episodes ended after tick 2: they are being scored
            scored.two_scored.wait(timeout=60)  # a bound only so that scoring held back to the end fails, not hangs
        events.append("tick")
        return generate(requests)

    backend.generate = logged_generate
    trainer.train()

    assert [size for size, _ in scored.calls] == [1] * 4  # once per episode, never as a batch
    assert all(name.startswith("episode-reward") for _, name in scored.calls)
    # the even problems' episodes were scored while the odd ones still generated: before the last tick
    last_tick = len(events) - 1 - events[::-1].index("tick")
    assert events.count("tick") == 4 and events[:last_tick].count("score") == 2
    rewards = trainer._logs["rewards"]
    assert rewards["recorded_boxed"] == rewards["boxed_answer_reward"]  # the same scores as the plain batch call
    assert sorted(trainer._logs["extra"]["scored"]) == ["row 2", "row 2", "row 3", "row 3"]  # replayed per row


def test_a_scored_reward_called_on_another_batch_fails():
    import concurrent.futures

    scored = EpisodeScored(RecordedBoxedReward([]), concurrent.futures.ThreadPoolExecutor(1))
    with pytest.raises(RuntimeError, match="not one whose episodes it scored"):
        scored(prompts=["x"], completions=["y"], answer=["1"])


def test_the_code_reward_scores_each_episode():
    assert CodeReward.scores_each_episode
