"""The engine's async mode: each call goes to the backend as its episode makes it, episodes never wait for each other,
every call is recorded once and in the order its episode made it, and a failing episode stops the whole rollout with
nothing left running. A scripted backend answers each request after its own delay, like a continuously batching
server."""

from __future__ import annotations

import asyncio

import pytest
from scripted import AsyncScriptedBackend, ScriptedBackend
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt, OrchWorkers, SingleAgent, Voting
from trl_multiagent.rollout.backends.event_loop import BackgroundLoop
from trl_multiagent.rollout.engine import EpisodeError, RolloutEngine
from trl_multiagent.workflows import Workflow

WORKFLOWS = [SingleAgent(), Voting(), EvalOpt(max_iterations=2), OrchWorkers()]


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(n)]


def echo(requests, rng) -> list[str]:
    """A reply that depends on the request alone (not on batch order): ticks and async must give the same episodes."""
    return [f"\\boxed{{{sum(len(m['content']) for m in r.messages) % 7}}} {r.adapter}" for r in requests]


def uneven_delay(request) -> float:
    """Long-tailed per-call latency: some calls take 10x others, so results come back out of order."""
    return 0.002 * (1 + (hash(str(request.messages)) % 10) ** 2 % 17)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def routes(workflow) -> dict[str, str]:
    return {role: role for role in workflow.roles}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: type(w).__name__)
def test_async_records_every_call_once_in_the_order_its_episode_made_it(tokenizer, workflow):
    ticks = RolloutEngine(workflow, ScriptedBackend(tokenizer, echo), routes(workflow)).run(prompts(6))
    backend = AsyncScriptedBackend(tokenizer, echo, uneven_delay)
    episodes = RolloutEngine(workflow, backend, routes(workflow), mode="async").run(prompts(6))

    assert backend.started == backend.finished == sum(len(e.calls) for e in episodes)  # each call recorded once
    for ours, theirs in zip(episodes, ticks):
        assert [(c.role, c.instance, c.messages, c.text) for c in ours.calls] == [
            (c.role, c.instance, c.messages, c.text) for c in theirs.calls
        ]
        assert ours.final_answer == theirs.final_answer
        assert all(c.completion_ids[-1] == tokenizer.eos_token_id for c in ours.calls)


class HeldFirstCall(AsyncScriptedBackend):
    """Episode 0's first call answers only once the other episodes have ended: if any episode waited for another
    (as ticks make every later call wait for the slowest of its batch), the hold would run out and episode 0 would
    not end last."""

    def __init__(self, tokenizer, others: set[int]):
        super().__init__(tokenizer, echo, lambda request: 0.0)
        self.others, self.ended = others, []

    async def agenerate(self, request):
        if "What is 0 + 2?" in request.messages[-1]["content"] and len(request.messages) == 1:
            for _ in range(3000):  # a bound on the hold only so that a broken engine fails instead of hanging
                if self.others <= set(self.ended):
                    break
                await asyncio.sleep(0.01)
        return await super().agenerate(request)


def test_no_episode_waits_for_another(tokenizer):
    backend = HeldFirstCall(tokenizer, others={1, 2, 3})
    engine = RolloutEngine(EvalOpt(max_iterations=3), backend, routes(EvalOpt()), mode="async")
    episodes = engine.run(prompts(4), on_episode_end=lambda episode: backend.ended.append(episode.index))
    assert all(len(e.calls) == 6 for e in episodes)  # three rounds each: the echo's verdict never says Correct
    assert sorted(backend.ended[:3]) == [1, 2, 3] and backend.ended[3] == 0  # all their calls ran while 0's waited


class FailsInEpisodeTwo(Workflow):
    roles = ("generator",)

    async def run(self, prompt, generate):
        first = await generate("generator", prompt)
        if "What is 2 + 2?" in prompt[-1]["content"]:
            raise ValueError("the parser met something it cannot read")
        return await generate("generator", [*prompt, {"role": "assistant", "content": first}, *prompt])


def test_a_failing_episode_fails_the_rollout_naming_it_and_cancels_every_pending_call(tokenizer):
    def delay(request):  # second calls are slow: they are running when episode 2 fails
        return 10.0 if len(request.messages) > 1 else 0.01

    backend = AsyncScriptedBackend(tokenizer, echo, delay)
    engine = RolloutEngine(FailsInEpisodeTwo(), backend, {"generator": "g"}, mode="async")
    with pytest.raises(EpisodeError, match="FailsInEpisodeTwo failed in episode 2: the parser met something") as error:
        engine.run(prompts(5))
    assert error.value.episode == 2
    assert backend.running == 0 and len(backend.cancelled) == 4  # the other episodes' second calls, all cancelled
    assert backend.finished == 5  # the first calls only


def test_async_needs_a_backend_that_takes_single_calls(tokenizer):
    with pytest.raises(ValueError, match="batches per tick.*rollout_mode='ticks'"):
        RolloutEngine(Voting(), ScriptedBackend(tokenizer, echo), routes(Voting()), mode="async")
    with pytest.raises(ValueError, match="must be one of"):
        RolloutEngine(Voting(), ScriptedBackend(tokenizer, echo), routes(Voting()), mode="continuous")


def test_background_loop_cancels_across_loops_and_drains():
    loop = BackgroundLoop("test")
    stopped = []

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # cleaning up (an abort) takes a moment
            stopped.append(True)
            raise

    async def caller():
        task = asyncio.ensure_future(loop.call(slow()))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert loop.run(asyncio.sleep(0, result=3)) == 3
    asyncio.run(caller())
    loop.drain(timeout=5)
    assert stopped == [True] and loop.in_flight() == 0
    loop.close()


def test_background_loop_runs_a_batch_and_stops_it_at_the_first_failure():
    """A backend's synchronous `generate` (run_all): results in request order; one failed request stops the others
    before its error reaches the caller, so nothing of that batch keeps running."""
    loop = BackgroundLoop("test")
    stopped = []

    async def answer(i: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return i

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionError("server 2 went away")

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append(True)
            raise

    assert loop.run_all([answer(i, 0.02 * (3 - i)) for i in range(3)]) == [0, 1, 2]
    with pytest.raises(ConnectionError, match="server 2"):
        loop.run_all([slow(), fails(), slow()])
    assert stopped == [True, True] and loop.in_flight() == 0
    loop.close()


def test_roles_on_two_bases_go_async_to_their_own_base(tokenizer):
    """With roles on several base models (`role_models`), each call goes as it is made to its base's backend; when a
    base's backend batches per tick only, the async mode is refused up front."""
    from trl_multiagent.rollout.backends.per_base import PerBaseBackend

    solver, judge = (
        AsyncScriptedBackend(tokenizer, echo, uneven_delay),
        AsyncScriptedBackend(tokenizer, echo, uneven_delay),
    )
    backend = PerBaseBackend({"solver-base": solver, "judge-base": judge})
    bases = {"generator": "solver-base", "evaluator": "judge-base"}
    workflow = EvalOpt(max_iterations=2)
    episodes = RolloutEngine(workflow, backend, routes(workflow), mode="async", base_for_role=bases).run(prompts(4))

    calls = [c for e in episodes for c in e.calls]
    assert solver.finished == sum(c.role == "generator" for c in calls) > 0
    assert judge.finished == sum(c.role == "evaluator" for c in calls) > 0
    assert all(c.base == bases[c.role] for c in calls)
    with pytest.raises(ValueError, match="batches per tick"):
        mixed = PerBaseBackend({"solver-base": solver, "judge-base": ScriptedBackend(tokenizer, echo)})
        RolloutEngine(workflow, mixed, routes(workflow), mode="async", base_for_role=bases)
