"""Roles with tools: the tool loop of one `generate`, TRL's `tools=` through `SingleAgent`, and a workflow whose
workers have a calculator, trained on the tiny model."""

from __future__ import annotations

import asyncio
import time
from unittest.mock import patch

import pytest
import torch
import trl
from datasets import Dataset
from scripted import AsyncScriptedBackend, ScriptedBackend, boxed_answer_reward, tool_call
from tiny import CPU_SETTINGS, tiny_config, tiny_lora
from transformers import AutoTokenizer

from trl_multiagent import MultiAgentGRPOTrainer, OrchWorkers, SingleAgent, Workflow
from trl_multiagent.evaluation.generation import EpisodeToolSettings
from trl_multiagent.rollout.engine import RolloutEngine
from trl_multiagent.rollout.tool_loop import build_role_tools
from trl_multiagent.tasks.sandbox import sandbox_available
from trl_multiagent.tasks.tools import calculator, run_python


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


async def async_multiply(a: int, b: int) -> int:
    """Multiply two integers, asynchronously.

    Args:
        a: the first factor.
        b: the second factor.
    """
    await asyncio.sleep(0)
    return a * b


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return a / b


def wait(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: how long to wait.
    """
    time.sleep(seconds)
    return "waited"


def undocumented(a: int) -> int:
    return a


@pytest.fixture
def tokenizer(tool_model_dir):
    return AutoTokenizer.from_pretrained(tool_model_dir)


class Solve(Workflow):
    roles = ("solver",)

    async def run(self, prompt, generate):
        return await generate("solver", prompt)


class AskThenSolve(Workflow):
    """A planner without tools, then a solver with them."""

    roles = ("planner", "solver")
    tools = {"solver": [multiply]}

    async def run(self, prompt, generate):
        plan = await generate("planner", prompt)
        return await generate("solver", [*prompt, {"role": "user", "content": f"Plan: {plan}"}])


def engine_for(
    workflow, backend, tokenizer, *, tools=None, role_tools=None, max_iterations=None, timeout=5.0, budget=10_000
):
    settings = EpisodeToolSettings(budget, max_tool_calling_iterations=max_iterations, tool_timeout=timeout)
    role_tools = build_role_tools(workflow, settings, lambda role: tokenizer, tools=tools, role_tools=role_tools)
    mode = "async" if hasattr(backend, "agenerate") else "ticks"
    adapters = {role: "shared" for role in workflow.roles}
    return RolloutEngine(workflow, backend, adapters, mode=mode, role_tools=role_tools)


def script(*turns: str):
    """Answers each call with the next of ``turns`` for its conversation (counted by its assistant turns)."""

    def respond(requests, rng):
        return [turns[min(sum(m["role"] == "assistant" for m in r.messages), len(turns) - 1)] for r in requests]

    return respond


PROMPT = [{"role": "user", "content": "What is 3 times 4?"}]


def test_a_tool_call_runs_and_its_output_is_the_next_prompt_never_a_completion(tokenizer):
    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=3, b=4), "It is 12."))
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply]).run([PROMPT])

    assert episode.final_answer == "It is 12."
    first, second = episode.calls
    assert (first.turn, first.tool_calls, first.tool_errors) == (0, 1, 0)
    assert (second.turn, second.tool_calls) == (1, 0)
    assert first.messages == PROMPT
    assistant, tool = second.messages[1:]
    assert assistant["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert tool == {"role": "tool", "name": "multiply", "content": "12"}
    # The tool output is a prompt token of the second call (masked from the loss), in no completion.
    second_prompt = tokenizer.decode(second.prompt_ids)
    assert "<tool_response>\n12\n</tool_response>" in second_prompt
    assert all("tool_response" not in tokenizer.decode(c.completion_ids) for c in episode.calls)
    # Every call's prompt describes the tools, in the chat template's format.
    assert all('"name": "multiply"' in tokenizer.decode(c.prompt_ids) for c in episode.calls)
    assert backend.requests[0].tools[0]["function"]["name"] == "multiply"


@pytest.mark.parametrize(
    "call, error",
    [
        (tool_call("multiply", a=3, c=4), "unexpected keyword argument 'c'"),
        (tool_call("divide", a=1, b=0), "division by zero"),
        (tool_call("subtract", a=1, b=2), "Tool 'subtract' not found"),
        (tool_call("wait", seconds=30), "timed out after 0.5s"),
    ],
)
def test_a_failing_tool_call_becomes_a_tool_turn_with_the_error(tokenizer, call, error):
    backend = ScriptedBackend(tokenizer, script(call, "Sorry."))
    engine = engine_for(Solve(), backend, tokenizer, tools=[multiply, divide, wait], timeout=0.5)
    (episode,) = engine.run([PROMPT])

    assert episode.final_answer == "Sorry."
    assert (episode.calls[0].tool_calls, episode.calls[0].tool_errors) == (1, 1)
    tool = episode.calls[1].messages[-1]
    assert tool["role"] == "tool" and error in tool["content"] and "error" in tool["content"]


def test_an_async_tool_and_several_calls_in_one_turn(tokenizer):
    both = tool_call("async_multiply", a=2, b=5) + "\n" + tool_call("multiply", a=3, b=3)
    backend = ScriptedBackend(tokenizer, script(both, "10 and 9."))
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply, async_multiply]).run([PROMPT])

    assert [m["content"] for m in episode.calls[1].messages[-2:]] == ["10", "9"]
    assert episode.calls[0].tool_calls == 2


@pytest.mark.parametrize("cap, calls", [(0, 1), (2, 3)])
def test_max_tool_calling_iterations_caps_the_rounds_of_tools(tokenizer, cap, calls):
    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=1, b=1)))  # calls the tool forever
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply], max_iterations=cap).run([PROMPT])

    assert len(episode.calls) == calls
    assert episode.final_answer == tool_call("multiply", a=1, b=1)  # the last call's text, as it is
    assert [c.tool_calls for c in episode.calls] == [1] * cap + [0]


def test_the_token_budget_bounds_the_whole_loop(tokenizer):
    # Budget: the tokens after the first prompt (completions and tool turns) across the loop, as max_completion_length
    # bounds GRPOTrainer's one tool-calling completion.
    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=3, b=4), "It is 12."))
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply]).run([PROMPT])
    first, second = episode.calls
    tool_turn = len(second.prompt_ids) - len(first.prompt_ids) - len(first.completion_ids)
    used = len(first.completion_ids) + tool_turn

    # Room for the tool turn: the next call may generate what is left of the budget, no more.
    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=3, b=4), "It is 12."))
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply], budget=used + 3).run([PROMPT])
    assert [r.generation_kwargs.get("max_tokens") for r in backend.requests] == [None, 3]
    assert [m["role"] for m in episode.answering_conversation().messages] == ["assistant", "tool", "assistant"]

    # No room for it: the tool ran (and counts), its output is dropped and the loop ends on the tool call.
    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=3, b=4), "It is 12."))
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply], budget=used - 1).run([PROMPT])
    assert len(episode.calls) == 1 and episode.calls[0].tool_calls == 1
    conversation = episode.answering_conversation()
    assert [m["role"] for m in conversation.messages] == ["assistant"] and conversation.messages[0]["tool_calls"]
    assert conversation.completion_ids == episode.calls[0].completion_ids


def test_the_conversation_that_answered_is_the_rewards_completion(tokenizer):
    from trl_multiagent.training.early_rewards import final_completion_ids, final_completions

    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=3, b=4), "12"))
    row = {"prompt": PROMPT}
    (episode,) = engine_for(AskThenSolve(), backend, tokenizer).run([PROMPT])
    (completion,) = final_completions([episode], [row])
    assert [m["role"] for m in completion] == ["assistant", "tool", "assistant"]  # the solver's, who answered
    assert final_completion_ids(episode)[-len(episode.calls[-1].completion_ids) :] == episode.calls[-1].completion_ids

    # A workflow that answers with text of its own: the reward sees that text, as one assistant message.
    class Rephrase(AskThenSolve):
        async def run(self, prompt, generate):
            return "Answer: " + await super().run(prompt, generate)

    (episode,) = engine_for(Rephrase(), backend, tokenizer).run([PROMPT])
    assert final_completions([episode], [row]) == [[{"role": "assistant", "content": "Answer: 12"}]]
    assert final_completion_ids(episode) == episode.calls[-1].completion_ids


def test_a_malformed_tool_call_is_text_and_ends_the_loop(tokenizer):
    malformed = '<tool_call>\n{"arguments": {a: 3}}\n</tool_call>'
    backend = ScriptedBackend(tokenizer, script(malformed))
    (episode,) = engine_for(Solve(), backend, tokenizer, tools=[multiply]).run([PROMPT])

    assert len(episode.calls) == 1 and episode.calls[0].tool_calls == 0


def test_only_the_roles_given_tools_see_them(tokenizer):
    backend = ScriptedBackend(tokenizer, script(tool_call("multiply", a=3, b=4), "12"))
    (episode,) = engine_for(AskThenSolve(), backend, tokenizer).run([PROMPT])

    assert [(c.role, c.turn) for c in episode.calls] == [("planner", 0), ("solver", 0), ("solver", 1)]
    planner = episode.calls[0]
    assert planner.tools is None and planner.tool_calls == 0  # its text calls a tool, but it has none
    assert "# Tools" not in tokenizer.decode(planner.prompt_ids)
    assert episode.calls[1].tool_calls == 1


def test_a_slow_tool_holds_up_only_its_own_episode(tokenizer):
    # Episode 0 calls a tool that sleeps; episode 1 answers without tools. In async mode episode 1 finishes
    # (and its request is answered) while episode 0's tool still runs on its thread.
    order = []

    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        order.append("tool done")
        return "ok"

    def respond(requests, rng):
        outputs = []
        for request in requests:
            first = request.messages[0]["content"]
            done = any(m["role"] == "tool" for m in request.messages)
            outputs.append("done" if done or first == "fast" else tool_call("slow", seconds=0.5))
            order.append(f"{first} answered")
        return outputs

    backend = AsyncScriptedBackend(tokenizer, respond, delay=lambda request: 0.0)
    engine = engine_for(Solve(), backend, tokenizer, tools=[slow])
    episodes = engine.run([[{"role": "user", "content": "slow"}], [{"role": "user", "content": "fast"}]])

    assert [e.final_answer for e in episodes] == ["done", "done"]
    assert order.index("fast answered") < order.index("tool done")


def test_tool_declarations_that_cannot_work_fail_at_construction(tokenizer, tiny_model_dir):
    with pytest.raises(ValueError, match="Google-style docstring"):
        engine_for(Solve(), None, tokenizer, tools=[undocumented])
    with pytest.raises(ValueError, match="two tools named 'multiply'"):
        engine_for(Solve(), None, tokenizer, tools=[multiply], role_tools={"solver": [multiply]})
    with pytest.raises(ValueError, match=r"names role\(s\) \['judge'\]"):
        engine_for(Solve(), None, tokenizer, role_tools={"judge": [multiply]})
    plain = AutoTokenizer.from_pretrained(tiny_model_dir)  # the tiny test template renders no tools
    with pytest.raises(ValueError, match="cannot render a tool conversation"):
        engine_for(Solve(), None, plain, tools=[multiply])


def test_an_engine_without_the_declared_tools_refuses_to_run_the_roles_without_them(tokenizer):
    backend = ScriptedBackend(tokenizer, script("12"))
    with pytest.raises(ValueError, match=r"gives tools to role\(s\) \['solver'\].*without `role_tools`"):
        RolloutEngine(AskThenSolve(), backend, {"planner": "shared", "solver": "shared"})


def test_calculator_evaluates_arithmetic_only():
    assert calculator("(3 + 4) * 12 - 2 ** 3") == "76"
    with pytest.raises(ValueError, match="Not an arithmetic expression"):
        calculator("__import__('os').getcwd()")
    with pytest.raises(ValueError, match="too large"):
        calculator("9 ** 9 ** 9")


@pytest.mark.skipif(not sandbox_available(), reason="the code sandbox needs root or unprivileged user namespaces")
def test_run_python_runs_the_program_in_the_sandbox():
    assert run_python("print(sum(range(5)))").strip() == "10"
    assert "[runtime_error]" in run_python("1 / 0") and "ZeroDivisionError" in run_python("1 / 0")


# ------------------------------------------------------------------------------------------- TRL's `tools=` drop-in
def fake_generate(tokenizer, tool_name: str):
    """`model.generate` answering as TRL's tools test scripts it: of the first three calls, one calls the tool right,
    one with a wrong argument name, one answers in text; every call after a tool result says "Done!"."""

    def generate(input_ids, attention_mask, **kwargs):
        rows = []
        for i, row in enumerate(input_ids.tolist()):
            prompt = tokenizer.decode(row)
            if "<tool_response>" in prompt:
                text = "Done!"
            else:
                text = [tool_call(tool_name, a=3, b=4), tool_call(tool_name, a=3, c=4), "I don't know any tool"][i % 3]
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        width = max(map(len, rows))
        rows = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    return generate


def done_reward(completions, **kwargs) -> list[float]:
    return [float("Done" in c[-1]["content"]) for c in completions]


class RecordingReward:
    """``done_reward``, keeping what each call was given."""

    __name__ = "done_reward"

    def __init__(self):
        self.seen = []

    def __call__(self, prompts, completions, completion_ids, **kwargs) -> list[float]:
        self.seen.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids})
        return done_reward(completions)


DROP_IN_SETTINGS = dict(num_generations=3, per_device_train_batch_size=3, max_completion_length=128, learning_rate=0.1)


def drop_in_dataset() -> Dataset:
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Multiply {i} and 4."}]} for i in range(3)])


def drop_in_trainer(model_dir, output_dir, reward=done_reward, **kwargs):
    return MultiAgentGRPOTrainer(
        model=model_dir,
        workflow=SingleAgent(template="raw"),
        reward_funcs=reward,
        args=tiny_config(output_dir, max_steps=1, **DROP_IN_SETTINGS),
        train_dataset=drop_in_dataset(),
        peft_config=tiny_lora(),
        **kwargs,
    )


@pytest.mark.parametrize("tool", [multiply, async_multiply])
def test_single_agent_with_tools_trains_as_grpo_trainer_with_tools(tool_model_dir, tmp_path, tool):
    trainer = drop_in_trainer(tool_model_dir, tmp_path, tools=[tool])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    with patch.object(trainer.model, "generate", side_effect=fake_generate(trainer._text_tokenizer, tool.__name__)):
        trainer.train()

    logs = trainer.state.log_history[0]
    assert logs["tools/call_frequency"] == pytest.approx(2 / 3)  # two of three episodes called the tool
    assert logs["tools/failure_frequency"] == pytest.approx(1 / 2)  # one of the two calls had a wrong argument
    # 3 first calls + 1 after a tool result: the wrong argument's error turn would pass the 128-token budget, so
    # that loop ends before it (its call still counts above), as in GRPOTrainer.
    assert logs["role/generator/turns_per_call"] == pytest.approx(4 / 3)
    assert logs["role/generator/calls"] == 4  # every model call of the loops is a sample
    changed = [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert changed


def test_max_tool_calling_iterations_bounds_the_trainers_tool_loops(tool_model_dir, tmp_path):
    """One of three episodes calls the tool right and answers after its result; with no tool round allowed, its call
    ends at the tool call, which is not run."""

    def logs(**settings) -> dict:
        trainer = MultiAgentGRPOTrainer(
            model=tool_model_dir,
            workflow=SingleAgent(template="raw"),
            reward_funcs=done_reward,
            args=tiny_config(tmp_path / str(settings), max_steps=1, **DROP_IN_SETTINGS, **settings),
            train_dataset=drop_in_dataset(),
            peft_config=tiny_lora(),
            tools=[multiply],
        )
        with patch.object(trainer.model, "generate", side_effect=fake_generate(trainer._text_tokenizer, "multiply")):
            trainer.train()
        return trainer.state.log_history[0]

    unbounded, none_allowed = logs(), logs(max_tool_calling_iterations=0)
    assert unbounded["role/generator/calls"] == 4 and unbounded["tools/call_frequency"] > 0
    assert none_allowed["role/generator/calls"] == 3 and none_allowed["tools/call_frequency"] == 0


def test_the_reward_sees_the_tool_conversation_as_grpo_trainer_passes_it(tool_model_dir, tmp_path):
    # What GRPOTrainer(tools=...) documents for a conversational prompt: the completion is the list of messages the
    # episode added: the parsed assistant message (its tool calls as `tool_calls`), one `tool` message per call
    # holding str(result), then the parsed assistant message that followed; and
    # `completion_ids` are every token after the prompt, tool turns included.
    reward = RecordingReward()
    trainer = drop_in_trainer(tool_model_dir, tmp_path, reward=reward, tools=[multiply])
    tokenizer = trainer._text_tokenizer
    with patch.object(trainer.model, "generate", side_effect=fake_generate(tokenizer, "multiply")):
        trainer.train()

    (seen,) = reward.seen
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}
    wrong = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "c": 4}}}
    assert seen["completions"] == [
        [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "multiply", "content": "12"},
            {"role": "assistant", "content": "Done!"},
        ],
        # The error turn (str of {"error": ...}) would pass the 128-token budget: dropped, the loop ends.
        [{"role": "assistant", "content": "", "tool_calls": [wrong]}],
        [{"role": "assistant", "content": "I don't know any tool"}],
    ]
    tool_turn = (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    after_prompt = tool_call("multiply", a=3, b=4) + tool_turn + "Done!<|im_end|>"
    assert tokenizer.decode(seen["completion_ids"][0]) == after_prompt
    assert tokenizer.decode(seen["completion_ids"][2]) == "I don't know any tool<|im_end|>"


def test_reward_inputs_and_tool_metrics_match_grpo_trainer_on_the_same_run(tool_model_dir, tmp_path):
    # The same scripted generations through TRL's GRPOTrainer(tools=...) and through ours.
    theirs, ours = RecordingReward(), RecordingReward()
    trl_trainer = trl.GRPOTrainer(
        model=tool_model_dir,
        reward_funcs=theirs,
        args=trl.GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1, **{**CPU_SETTINGS, **DROP_IN_SETTINGS}),
        train_dataset=drop_in_dataset(),
        peft_config=tiny_lora(),
        tools=[multiply],
    )
    trainer = drop_in_trainer(tool_model_dir, tmp_path / "ours", reward=ours, tools=[multiply])
    for run in (trl_trainer, trainer):
        with patch.object(run.model, "generate", side_effect=fake_generate(trainer._text_tokenizer, "multiply")):
            run.train()

    assert ours.seen[0]["prompts"] == theirs.seen[0]["prompts"]
    assert ours.seen[0]["completions"] == theirs.seen[0]["completions"]
    tools_logged = [
        {k: v for k, v in t.state.log_history[0].items() if k.startswith("tools/")} for t in (trainer, trl_trainer)
    ]
    assert tools_logged[0] == pytest.approx(tools_logged[1])  # TRL's in float32
    assert tools_logged[0] == {"tools/call_frequency": 2 / 3, "tools/failure_frequency": 0.5}


def test_drop_in_refuses_what_a_workflow_replaces(tool_model_dir, tiny_model_dir, tmp_path):
    with pytest.raises(ValueError) as refused:
        drop_in_trainer(tool_model_dir, tmp_path, rollout_func=lambda prompts, trainer: {})
    message = str(refused.value)
    assert message.startswith(
        "MultiAgentGRPOTrainer does not take `rollout_func`: it replaces GRPOTrainer's generation"
    )
    assert "many model calls per episode, each a training sample of its role" in message  # the reason
    assert "Write the rollout as a Workflow instead" in message and "`environment_factory`" in message  # the fix
    with pytest.raises(TypeError, match="unexpected keyword argument 'rollout_funcs'"):
        drop_in_trainer(tool_model_dir, tmp_path, rollout_funcs=None)
    with pytest.raises(ValueError, match="cannot render a tool conversation"):
        drop_in_trainer(tiny_model_dir, tmp_path, tools=[multiply])


# ---------------------------------------------------------------------------- a workflow whose workers use tools
def workers_use_the_calculator(requests, rng):
    """Orchestrator: two strategies; each worker calls the calculator on its first turn (the second one with a broken
    expression), then answers; the synthesizer answers, right half the time, so groups have a learning signal."""
    outputs = []
    for request in requests:
        text = " ".join(m.get("content") or "" for m in request.messages)
        if request.tools is None and "STRATEGY" in text and "Solution" not in text:
            outputs.append("STRATEGY 1: add directly\nSTRATEGY 2: count up")
        elif request.tools is not None and request.messages[-1]["role"] != "tool":
            outputs.append(tool_call("calculator", expression="2 + 2" if "add directly" in text else "2 +"))
        else:
            outputs.append(f"\\boxed{{{rng.choice([4, 5])}}}")
    return outputs


def test_orch_workers_with_a_calculator_for_the_workers_trains(tool_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}] * 4)
    trainer = MultiAgentGRPOTrainer(
        model=tool_model_dir,
        workflow=OrchWorkers(n_workers=2),
        reward_funcs=boxed_answer_reward,
        args=tiny_config(
            tmp_path,
            max_steps=2,
            learning_rate=0.1,
            policy_sharing="isolated",
            max_completion_length=256,
            logging_steps=1,
        ),
        train_dataset=dataset,
        peft_config=tiny_lora(),
        processing_class=tokenizer,
        rollout_backend=ScriptedBackend(tokenizer, workers_use_the_calculator),
        role_tools={"worker": [calculator]},
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()

    steps = [log for log in trainer.state.log_history if "role/worker/tool_calls" in log]
    assert len(steps) == 2
    for log in steps:
        assert log["role/worker/tool_calls"] == 1.0  # each worker's generate made one tool call
        assert log["role/worker/turns_per_call"] == 2.0  # the calculator's output, then the answer
        assert log["role/worker/tool_errors"] == 0.5  # the broken expression: an error turn, not a crash
        assert "role/orchestrator/tool_calls" not in log and "role/synthesizer/tool_calls" not in log
    moved = {
        n.split(".")[-2] for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])
    }
    assert "worker" in moved
