"""TRL's `environment_factory` through a workflow with one role: one environment per episode, its methods the role's
tools, its reward a reward function; a dict of factories routed by the rows' `environment` column."""

from __future__ import annotations

import pytest
from datasets import Dataset
from scripted import ScriptedBackend, tool_call
from tiny import tiny_config, tiny_lora
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt, MultiAgentGRPOTrainer, SingleAgent
from trl_multiagent.rollout.environments import check_environment_run


class Counter:
    """Counts from the row's `start`; owns the reward: the count."""

    made = 0

    def __init__(self):
        Counter.made += 1
        self.count = None

    def reset(self, **row) -> str:
        self.count = row.get("start", 0)
        return f" Start at {self.count}."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: how much to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)

    def _hidden(self) -> None:
        """Not a tool."""


class Echo:
    """Repeats; the data is its own (no prompt in the row)."""

    def __init__(self):
        self.heard = []

    def reset(self, **row) -> str:
        return "Say something."

    def shout(self, text: str) -> str:
        """Repeat loudly.

        Args:
            text: what to repeat.
        """
        self.heard.append(text)
        return text.upper()


class Recorder:
    """A reward function keeping what it was given; 0.5 per episode."""

    __name__ = "recorder"

    def __init__(self):
        self.seen = []

    def __call__(self, prompts, completions, environments, **kwargs) -> list[float]:
        counts = [getattr(e, "count", None) for e in environments]  # now: the instances are reset for the next batch
        self.seen.append(
            {"prompts": prompts, "completions": completions, "environments": list(environments), "counts": counts}
        )
        return [0.5] * len(completions)


def use_the_tool(requests, rng) -> list[str]:
    """Calls the first tool its prompt offers, then says "Done"."""
    outputs = []
    for request in requests:
        if request.messages[-1]["role"] == "tool":
            outputs.append("Done")
        elif request.tools[0]["function"]["name"] == "increment":
            outputs.append(tool_call("increment", step=2))
        else:
            outputs.append(tool_call("shout", text="hi"))
    return outputs


def env_trainer(model_dir, output_dir, dataset, environment_factory, reward, backend, **overrides):
    settings = dict(max_steps=1, num_generations=2, per_device_train_batch_size=4, max_completion_length=256)
    return MultiAgentGRPOTrainer(
        model=model_dir,
        workflow=SingleAgent(template="raw"),
        reward_funcs=reward,
        args=tiny_config(output_dir, learning_rate=0.1, **{**settings, **overrides}),
        train_dataset=dataset,
        peft_config=tiny_lora(),
        rollout_backend=backend,
        environment_factory=environment_factory,
    )


def test_one_environment_per_episode_its_methods_the_tools_its_reward_a_reward(tool_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    rows = [{"prompt": [{"role": "user", "content": "Count."}], "start": start} for start in (10, 20)]
    reward, backend = Recorder(), ScriptedBackend(tokenizer, use_the_tool)
    Counter.made = 0
    trainer = env_trainer(tool_model_dir, tmp_path, Dataset.from_list(rows), Counter, reward, backend, max_steps=2)
    assert Counter.made == 1  # the constructor's probe, which TRL keeps as the pool's first instance
    trainer.train()

    assert Counter.made == 4  # a batch of four episodes needs four instances; the next batch reuses them
    for seen in reward.seen:
        environments = seen["environments"]
        assert len({id(e) for e in environments}) == 4  # one per episode
        for prompt, completion, count in zip(seen["prompts"], seen["completions"], seen["counts"]):
            start = int(prompt[-1]["content"].removeprefix("Count. Start at ").rstrip("."))  # `reset`'s text, added
            assert count == start + 2  # its own episode's tool call, on its own instance
            assert completion[1] == {"role": "tool", "name": "increment", "content": str(start + 2)}
    assert all([t["function"]["name"] for t in r.tools] == ["increment"] for r in backend.requests)
    for log in trainer.state.log_history[:2]:
        assert log["rewards/Counter/mean"] == 17.0  # `get_reward` (12 and 22), weight 1, named after the class
        assert log["reward"] == pytest.approx(log["rewards/Counter/mean"] + 0.5)
        assert log["tools/call_frequency"] == 1.0


def test_a_dict_of_factories_routes_rows_by_their_environment_column(tool_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    rows = [{"environment": "counter"}, {"environment": "echo"}]  # no prompt: each environment's `reset` gives it
    reward, backend = Recorder(), ScriptedBackend(tokenizer, use_the_tool)
    factories = {"counter": Counter, "echo": Echo}
    trainer = env_trainer(tool_model_dir, tmp_path, Dataset.from_list(rows), factories, reward, backend)
    trainer.train()

    (seen,) = reward.seen
    for prompt, environment in zip(seen["prompts"], seen["environments"]):
        expected = " Start at 0." if isinstance(environment, Counter) else "Say something."
        assert prompt == [{"role": "user", "content": expected}]
    offered = {r.messages[0]["content"]: {t["function"]["name"] for t in r.tools} for r in backend.requests}
    assert offered == {" Start at 0.": {"increment"}, "Say something.": {"shout"}}  # only its own environment's
    echoes = [e for e in seen["environments"] if isinstance(e, Echo)]
    assert echoes and all(e.heard == ["hi"] for e in echoes)
    # Echo has no `get_reward`: its episodes have no Counter reward (NaN, left out of the mean), as in TRL.
    assert trainer.state.log_history[0]["rewards/Counter/mean"] == 2.0

    with pytest.raises(ValueError, match=r"`environment` \['maze'\].*names \['counter', 'echo'\]"):
        trainer._rollout.environment_runs.start([{"environment": "maze"}])


def test_without_a_dataset_the_environment_gives_the_prompts(tool_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    reward, backend = Recorder(), ScriptedBackend(tokenizer, use_the_tool)
    trainer = env_trainer(tool_model_dir, tmp_path, None, Counter, reward, backend)
    trainer.train()

    assert [p[-1]["content"] for p in reward.seen[0]["prompts"]] == [" Start at 0."] * 4


def test_environments_that_cannot_work_here_fail_at_construction(tool_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    backend = ScriptedBackend(tokenizer, use_the_tool)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Count."}]}])
    with pytest.raises(ValueError, match=r"roles \['generator', 'evaluator'\].*role_tools"):
        MultiAgentGRPOTrainer(
            model=tool_model_dir,
            workflow=EvalOpt(),
            reward_funcs=Recorder(),
            args=tiny_config(tmp_path),
            train_dataset=dataset,
            peft_config=tiny_lora(),
            rollout_backend=backend,
            environment_factory=Counter,
        )
    with pytest.raises(ValueError, match="rollout_ahead=1 would reset the next batch's environments"):
        check_environment_run(("generator",), rollout_ahead=1)  # the config takes rollout_ahead with vLLM only
    with pytest.raises(ValueError, match="must define a callable `reset`"):  # TRL's own check
        env_trainer(tool_model_dir, tmp_path, dataset, Recorder, Recorder(), backend)
