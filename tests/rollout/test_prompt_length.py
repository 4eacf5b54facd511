"""`max_prompt_length` in the rollout engine: a call whose prompt is over the limit, counted as the backend renders
it, is never generated; its episode ends there and comes back dropped (no call, no answer), as the reference's rollout
engine raises `TerminationEvent(MAX_PROMPT_LENGTH_EXCEEDED)` before generating (rllm/engine/rollout/verl_engine.py:
83-85) and its trainer leaves an episode without trajectories out of the batch (rllm/engine/agent_workflow_engine.py:
306-312)."""

from __future__ import annotations

import pytest
from scripted import AsyncScriptedBackend, ScriptedBackend
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt
from trl_multiagent.rollout.chat_rendering import ChatRenderer
from trl_multiagent.rollout.engine import RolloutEngine
from trl_multiagent.workflows import Workflow

PROBLEMS = [[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(3)]
LONG_ATTEMPT = "\\boxed{3}" + " because" * 60  # episode 1's first attempt: its evaluator's prompt gets too long


def attempts(requests, rng) -> list[str]:
    outputs = []
    for request in requests:
        if request.adapter == "evaluator":
            outputs.append("\\boxed{Incorrect}")
        else:
            long = "What is 1 + 2?" in request.messages[0]["content"] and len(request.messages) == 1
            outputs.append(LONG_ATTEMPT if long else "\\boxed{3}")
    return outputs


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("mode", ["ticks", "async"])
def test_an_over_long_call_ends_its_episode_unsent(tokenizer, mode):
    """Eval-Opt, shared history: episode 1's evaluator would see its long first attempt. With the limit between the
    first call's prompt and that one, episode 1 ends there (its first call made, the evaluator's never sent) and
    comes back dropped; the other two run their four calls."""
    workflow = EvalOpt(max_iterations=2)
    if mode == "ticks":
        backend = ScriptedBackend(tokenizer, attempts)
    else:
        backend = AsyncScriptedBackend(tokenizer, attempts, lambda request: 0.001)
    routes = {role: role for role in workflow.roles}
    free = RolloutEngine(workflow, ScriptedBackend(tokenizer, attempts), routes).run(PROBLEMS)
    renderer = ChatRenderer(tokenizer)
    longest_kept = max(len(renderer.prompt_ids(c.messages)) for e in (free[0], free[2]) for c in e.calls)
    too_long = len(renderer.prompt_ids(free[1].calls[1].messages))
    assert len(renderer.prompt_ids(free[1].calls[0].messages)) <= longest_kept < too_long

    ended = []
    engine = RolloutEngine(workflow, backend, routes, mode=mode, max_prompt_length=longest_kept)
    episodes = engine.run(PROBLEMS, on_episode_end=lambda e: ended.append(e.index))

    assert sorted(ended) == [0, 1, 2]  # every episode reports its end, the dropped one too (its rewards start there)
    assert [e.dropped for e in episodes] == [False, True, False]
    assert episodes[1].calls == [] and episodes[1].final_answer == ""
    for kept, without_limit in zip((episodes[0], episodes[2]), (free[0], free[2])):
        assert [c.messages for c in kept.calls] == [c.messages for c in without_limit.calls]
        assert kept.final_answer == without_limit.final_answer
    sent = [r.messages for r in backend.requests]
    assert free[1].calls[0].messages in sent and free[1].calls[1].messages not in sent  # never generated
    assert len(sent) == 4 + 4 + 1


def test_a_limit_needs_a_backend_that_measures_prompts(tokenizer):
    class Unmeasured:
        def generate(self, requests):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="has no `prompt_ids"):
        RolloutEngine(EvalOpt(), Unmeasured(), {"generator": "g", "evaluator": "e"}, max_prompt_length=10)


def test_a_workflow_that_catches_the_refusal_is_dropped_all_the_same(tokenizer):
    """A workflow may catch every exception of a call and carry on: the episode still ends as dropped."""

    class Stubborn(Workflow):
        roles = ("generator",)

        async def run(self, prompt, generate):
            try:
                return await generate("generator", [{"role": "user", "content": "long " * 200}])
            except Exception:
                return await generate("generator", prompt)

    backend = ScriptedBackend(tokenizer, lambda requests, rng: ["\\boxed{3}"] * len(requests))
    (episode,) = RolloutEngine(Stubborn(), backend, {"generator": "g"}, max_prompt_length=50).run(PROBLEMS[:1])
    assert episode.dropped and episode.calls == [] and episode.final_answer == ""
