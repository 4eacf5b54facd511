"""Evaluation runs roles with tools as training does: a workflow's declared tools, and `role_tools` given to the
evaluator, each through the role's tool loop; the reward sees the answering role's tool conversation."""

from __future__ import annotations

from unittest.mock import patch

import torch
from scripted import ScriptedBackend, tool_call

from trl_multiagent import Workflow
from trl_multiagent.evaluation import EvalSettings, final_answer_rewards, make_generation_config, run_episodes
from trl_multiagent.evaluation.evaluator import sample_episodes
from trl_multiagent.evaluation.modes import plan_mode


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def note(text: str) -> str:
    """Keep a note.

    Args:
        text: the note.
    """
    return f"noted: {text}"


class PlanThenSolve(Workflow):
    """The solver declares a calculator; the planner has none of its own."""

    roles = ("planner", "solver")
    tools = {"solver": [multiply]}

    async def run(self, prompt, generate):
        plan = await generate("planner", prompt)
        return await generate("solver", [*prompt, {"role": "user", "content": f"Plan: {plan}"}])


ROWS = [{"prompt": [{"role": "user", "content": "What is 3 times 4?"}], "answer": "12"}]


def calls_its_tool_first(requests, rng) -> list[str]:
    outputs = []
    for request in requests:
        if request.tools is None or request.messages[-1]["role"] == "tool":
            outputs.append("\\boxed{12}")
        elif request.tools[0]["function"]["name"] == "multiply":
            outputs.append(tool_call("multiply", a=3, b=4))
        else:
            outputs.append(tool_call("note", text="multiply"))
    return outputs


def test_the_evaluator_runs_declared_tools_and_role_tools(tool_model_dir):
    trained = plan_mode("base", None, PlanThenSolve(), tool_model_dir).load("cpu")
    backend = ScriptedBackend(trained.tokenizer, calls_its_tool_first)
    settings = EvalSettings(task="math", max_completion_length=256, max_tool_calling_iterations=1)

    ((_, (episode,)),) = list(sample_episodes(trained, ROWS, settings, backend, role_tools={"planner": [note]}))

    assert [(c.role, c.turn, c.tool_calls) for c in episode.calls] == [
        ("planner", 0, 1),
        ("planner", 1, 0),
        ("solver", 0, 1),
        ("solver", 1, 0),
    ]
    assert episode.calls[1].messages[-1] == {"role": "tool", "name": "note", "content": "noted: multiply"}
    assert episode.calls[3].messages[-1] == {"role": "tool", "name": "multiply", "content": "12"}
    completion = episode.answering_conversation().messages  # the solver's (both answered alike: the latest begun)
    assert completion[0]["tool_calls"][0]["function"]["name"] == "multiply"
    assert [m["role"] for m in completion] == ["assistant", "tool", "assistant"]
    same = final_answer_rewards(
        lambda completions, **kw: [float(c == completion) for c in completions], [episode], ROWS
    )
    assert same == [1.0]  # the reward is given that conversation
    # Without `role_tools` the planner has no tools: its prompt offers none, and its one call is the answer.
    backend = ScriptedBackend(trained.tokenizer, calls_its_tool_first)
    ((_, (episode,)),) = list(sample_episodes(trained, ROWS, settings, backend))
    assert [(c.role, c.turn) for c in episode.calls] == [("planner", 0), ("solver", 0), ("solver", 1)]


def test_a_loaded_workflow_runs_its_declared_tools_through_the_transformers_backend(tool_model_dir):
    trained = plan_mode("base", None, PlanThenSolve(), tool_model_dir).load("cpu")
    tokenizer = trained.tokenizer

    def generate(input_ids, attention_mask, **kwargs):
        # The solver's first call (its prompt offers the tool) calls it; every other call answers.
        rows = []
        for row in input_ids.tolist():
            prompt = tokenizer.decode(row)
            calls = '"name": "multiply"' in prompt and "<tool_response>" not in prompt
            text = tool_call("multiply", a=3, b=4) if calls else "\\boxed{12}"
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        width = max(map(len, rows))
        rows = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(rows)], dim=1)

    with patch.object(trained.model, "generate", side_effect=generate):
        (episode,) = run_episodes(trained, [ROWS[0]["prompt"]], make_generation_config(trained, 128))

    assert [(c.role, c.turn, c.tool_calls) for c in episode.calls] == [
        ("planner", 0, 0),
        ("solver", 0, 1),
        ("solver", 1, 0),
    ]
    assert "<tool_response>\n12\n</tool_response>" in tokenizer.decode(episode.calls[2].prompt_ids)
    assert episode.final_answer == "\\boxed{12}"
