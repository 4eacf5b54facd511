"""Servers that outlive trainers, and servers that fail them: a trainer loads its adapters beside another run's and
proves from the server's answers which version served each call; a server that died, stalled, lost its engine or
restarted stops training with an error naming it, the newest complete checkpoint and the resume command; with
failover, a lost server's calls go to the others and it rejoins, re-synced, once it answers again; every process of a
run sends the names the main process loaded.

Stand-in servers on 127.0.0.1 keep vLLM's adapter registry rules (tests/vllm_stand_in.py); no vLLM needed.
"""

from __future__ import annotations

import functools
import logging
import socket
import traceback

import pytest
from peft import get_peft_model
from tiny import tiny_lora
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_stand_in import start_stand_in, stop_stand_in

from trl_multiagent import EvalOpt
from trl_multiagent.checkpoints.atomic import REQUIRED_FILES
from trl_multiagent.checkpoints.resume_command import COMMAND_VARIABLE, resume_advice
from trl_multiagent.monitoring.adapter_check import provenance_mismatches
from trl_multiagent.rollout.backends import vllm_server
from trl_multiagent.rollout.backends.base import GenerationRequest, Provenance
from trl_multiagent.rollout.backends.vllm_server import ServerError, ServerLostError, VLLMServerBackend
from trl_multiagent.rollout.engine import EpisodeError, RolloutEngine

ROLES = ("generator", "evaluator")
QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]


@pytest.fixture
def stand_ins():
    started = []

    def start(port: int = 0, mode: str = "serve"):
        started.append(start_stand_in(port, mode))
        return started[-1]

    yield start
    for server, _ in started:
        stop_stand_in(server)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(vllm_server, "_RETRY_DELAYS", (0.01, 0.01))  # a refused server fails in ms, not 7.5 s


@pytest.fixture(scope="module")
def peft_model(tiny_model_dir):
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_lora(), adapter_name=ROLES[0])
    model.add_adapter(ROLES[1], tiny_lora())
    return model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def server_backend(urls, tokenizer, step=lambda: 0, **kwargs) -> VLLMServerBackend:
    return VLLMServerBackend(urls, tokenizer, ROLES, {"max_tokens": 1}, [0], timeout=10, weights_step=step, **kwargs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_run_loads_beside_another_runs_adapters_and_the_server_says_which_version_served(
    stand_ins, peft_model, tokenizer
):
    server, url = stand_ins()
    step = [0]
    first = server_backend(url, tokenizer, step=lambda: step[0])
    first.sync_adapters(peft_model)
    step[0] = 1
    first.sync_adapters(peft_model)  # the next version: loaded under a new name, the one it replaces unloaded
    held_by_first = dict(server.adapters)
    assert sorted(name.split("@")[0] for name in held_by_first) == sorted(["__base__", *ROLES])
    # The first run dies (nothing closes it); a second one, or the same run resumed, attaches to the same server.
    second = server_backend(url, tokenizer, step=lambda: 5)
    second.sync_adapters(peft_model)  # under the plain names, vLLM answers 400 "has already been loaded" here
    assert held_by_first.items() <= server.adapters.items()  # the first run's adapters are untouched
    results = second.generate([GenerationRequest(role, QUESTION) for role in ROLES])
    assert [r.provenance for r in results] == [Provenance(role, 5, "vllm-server") for role in ROLES]
    assert server.served == [second.served.name_of(role) for role in ROLES]  # what the stamps were read from
    # A server that answers with another adapter than the one asked for is caught by the provenance check.
    server.answer_as = next(name for name in held_by_first if name.startswith("generator@"))
    (result,) = second.generate([GenerationRequest("generator", QUESTION)])
    assert result.provenance == Provenance(server.answer_as, None, "vllm-server")
    calls = [type("Call", (), {"role": "generator", "provenance": result.provenance})()]
    (found,) = provenance_mismatches(calls, {"generator": "generator"}, version=5, step=5).values()
    assert found.stamped_wrong and "should be served by adapter 'generator' at version 5" in found.message
    first_run = first.served.run
    assert f"served by {server.answer_as!r}, an adapter another trainer loaded (run tag {first_run!r}" in found.message
    first.close()
    second.close()


def write_run(run_dir, complete=(1, 2), partial=(3,)):
    for step in complete:
        folder = run_dir / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        for name in REQUIRED_FILES:
            (folder / name).write_text("{}")
    for step in partial:  # a save that did not finish: never the one to resume from
        (run_dir / f"checkpoint-{step}").mkdir(parents=True)


@pytest.mark.parametrize("cause", ["died", "stalled", "engine", "restarted"])
def test_each_way_a_server_fails_names_it_the_newest_checkpoint_and_the_resume_command(
    cause, stand_ins, peft_model, tokenizer, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    typed = f"trl-multiagent train eval_opt --config toy --output_dir {run_dir}"
    monkeypatch.setenv(COMMAND_VARIABLE, typed)
    server, url = stand_ins()
    port = server.server_address[1]
    kwargs = {"request_timeout": 0.5} if cause == "stalled" else {}
    backend = server_backend(url, tokenizer, next_steps=functools.partial(resume_advice, str(run_dir)), **kwargs)
    backend.sync_adapters(peft_model)
    if cause in ("died", "restarted"):
        stop_stand_in(server)
    if cause == "restarted":
        stand_ins(port)  # back on its port, without the adapters
    server.mode = {"stalled": "stall", "engine": "engine"}.get(cause, "serve")
    with pytest.raises(ServerLostError) as lost:
        backend.generate([GenerationRequest("generator", QUESTION)])
    message = str(lost.value)
    said = {
        "died": "refused or dropped /v1/completions on 3 tries",
        "stalled": "did not answer /v1/completions within 0.5 s (vllm_request_timeout)",
        "engine": "answered /v1/completions with HTTP 500",
        "restarted": "answered /v1/completions with 404",
    }[cause]
    assert message.startswith(f"vLLM server {url} {said}") and lost.value.cause == cause
    assert f"trl-multiagent vllm-serve --config <your training yaml> --port {port}" in message
    resume = f"`{typed} --resume_from_checkpoint {run_dir}/checkpoint-2`"
    assert f"The run's newest complete checkpoint is {run_dir}/checkpoint-2: resume from it with {resume}" in message
    assert {"engine": "EngineCore", "stalled": "stays stuck", "restarted": "no longer holds"}.get(cause, "") in message
    assert "vllm_server_failover" not in message  # one server: nothing to fail over to
    backend.close()


def test_failover_sends_in_flight_and_later_calls_to_the_others_and_a_server_back_rejoins(
    stand_ins, peft_model, tokenizer, caplog
):
    (one, url_one), (two, url_two) = stand_ins(), stand_ins()
    backend = server_backend([url_one, url_two], tokenizer, failover=True)
    backend.sync_adapters(peft_model)
    two.mode = "drop"  # dies under every request it holds
    engine = RolloutEngine(EvalOpt(max_iterations=2), backend, dict(zip(ROLES, ROLES)), mode="async")
    with caplog.at_level(logging.WARNING, logger=vllm_server.__name__):
        episodes = engine.run([[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(8)])
    calls = [c for e in episodes for c in e.calls]
    assert len(calls) == 8 * 4 and len(one.served) == len(calls)  # every call answered by the server left
    assert two.seen["/v1/completions"] > 0  # it held calls when it died: they went to the other one
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"vLLM server {url_two} refused or dropped /v1/completions") and url_one in warning
    metrics = backend.rollout_metrics()
    assert metrics["rollout/servers_down"] == 1.0 and metrics["rollout/calls_failed_over"] >= 1.0

    port = two.server_address[1]
    stop_stand_in(two)
    backend.sync_adapters(peft_model)  # it is down: the new versions go to the other server
    assert set(one.adapters) == set(backend.served.current.values())
    back, _ = stand_ins(port)  # restarted on its port, empty
    backend.sync_adapters(peft_model)  # asked for /health between steps: it answers, and gets the current adapters
    assert set(back.adapters) == set(one.adapters) == set(backend.served.current.values())
    assert backend.rollout_metrics() == {"rollout/servers_down": 0.0, "rollout/calls_failed_over": 0.0}
    engine.run([[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(8)])
    assert back.served and set(back.served) <= set(backend.served.current.values())
    backend.close()


def test_without_failover_the_first_lost_server_stops_the_rollout_and_says_failover_exists(
    stand_ins, peft_model, tokenizer
):
    (_, url_one), (two, url_two) = stand_ins(), stand_ins()
    backend = server_backend([url_one, url_two], tokenizer)
    backend.sync_adapters(peft_model)
    two.mode = "drop"
    engine = RolloutEngine(EvalOpt(max_iterations=2), backend, dict(zip(ROLES, ROLES)), mode="async")
    with pytest.raises(EpisodeError) as stopped:
        engine.run([[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(8)])
    lost = stopped.value.__cause__
    assert isinstance(lost, ServerLostError) and lost.url == url_two and lost.cause == "died"
    assert "vllm_server_failover=True carries on with the others" in str(lost)
    assert backend._loop.in_flight() == 0  # every other call was cancelled before the error was raised
    backend.close()


def test_failover_stops_once_no_server_is_left_naming_each(stand_ins, peft_model, tokenizer):
    (one, url_one), (two, url_two) = stand_ins(), stand_ins()
    backend = server_backend([url_one, url_two], tokenizer, failover=True)
    backend.sync_adapters(peft_model)
    one.mode, two.mode = "engine", "drop"
    with pytest.raises(ServerError, match="No vLLM server is left to serve this run") as stopped:
        backend.generate([GenerationRequest("generator", QUESTION) for _ in range(4)])
    assert f"vLLM server {url_one} answered" in str(stopped.value) and f"vLLM server {url_two} refused" in str(
        stopped.value
    )
    backend.close()


def test_an_adapter_the_server_refuses_is_a_setting_to_fix_not_a_lost_server(stand_ins, peft_model, tokenizer):
    (one, url_one), (_, url_two) = stand_ins(), stand_ins()
    backend = server_backend([url_one, url_two], tokenizer, failover=True)
    one.load_error = "LoRA rank 8 is greater than max_lora_rank 4."  # what vLLM answers for a server started too small
    with pytest.raises(ServerError, match="load_lora_adapter failed \\(500\\).*greater than max_lora_rank") as error:
        backend.sync_adapters(peft_model)
    assert not isinstance(error.value, ServerLostError) and backend.down == {}  # no failover from a setting
    backend.close()


def test_every_process_sends_the_names_the_main_process_loaded(stand_ins, peft_model, tokenizer):
    server, url = stand_ins()
    main = server_backend(url, tokenizer, step=lambda: 3, run="run1")
    other = server_backend(url, tokenizer, step=lambda: 3, run="run1")
    with pytest.raises(RuntimeError, match="never sent to vLLM"):
        other.generate([GenerationRequest("generator", QUESTION)])
    main.sync_adapters(peft_model)
    other.follow_sync()  # what the other processes do while the main one syncs
    (result,) = other.generate([GenerationRequest("evaluator", QUESTION)])
    assert server.served == [main.served.name_of("evaluator")]
    assert result.provenance == Provenance("evaluator", 3, "vllm-server")
    main.close()
    other.close()


def test_a_start_without_servers_names_every_silent_one(tokenizer):
    silent = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with pytest.raises(ServerError) as error:
        VLLMServerBackend(silent, tokenizer, ROLES, {}, [0], timeout=1)
    assert all(f"No vLLM server answered at {url}/health" in str(error.value) for url in silent)


def exception_chain(error: BaseException) -> list[BaseException]:
    """``error`` and every exception Python prints above it, oldest (printed first) first."""
    chain = [error]
    while True:
        below = chain[0].__cause__ or (None if chain[0].__suppress_context__ else chain[0].__context__)
        if below is None:
            return chain
        chain.insert(0, below)


@pytest.mark.parametrize("rollout_mode", ["ticks", "async"])
def test_a_killed_server_is_the_first_error_of_the_trainings_traceback(
    rollout_mode, stand_ins, tiny_model_dir, tmp_path, monkeypatch
):
    """A vLLM server that dies while the trainer rolls out stops training with the server's error printed first:
    the URL, the newest complete checkpoint and the resume command, chained under nothing (not under the engine's
    event-loop probe, "no running event loop", nor under the transport error the message already names)."""
    from tiny import tiny_trainer

    run_dir = tmp_path / "run"
    write_run(run_dir)
    typed = f"trl-multiagent train eval_opt --config toy --output_dir {run_dir}"
    monkeypatch.setenv(COMMAND_VARIABLE, typed)
    server, url = stand_ins()
    trainer = tiny_trainer(
        tiny_model_dir,
        run_dir,
        EvalOpt(max_iterations=2),
        rollout_backend="vllm",
        vllm_mode="server",
        vllm_server_base_urls=[url],
        rollout_mode=rollout_mode,
        max_steps=2,
    )
    server.mode = "drop"  # its process dies under every completion it holds
    with pytest.raises(Exception) as stopped:
        trainer.train()
    chain = exception_chain(stopped.value)
    first = chain[0]
    printed = "".join(traceback.format_exception(stopped.value))
    assert isinstance(first, ServerLostError) and first.url == url and first.cause == "died"
    assert "no running event loop" not in printed and "During handling of the above exception" not in printed
    assert not any(isinstance(e, RuntimeError) and "event loop" in str(e) for e in chain)
    first_error_line = next(line for line in printed.splitlines() if line and not line.startswith((" ", "Traceback")))
    assert first_error_line.startswith(
        f"trl_multiagent.rollout.backends.server_errors.ServerLostError: vLLM server {url}"
    )
    resume = f"`{typed} --resume_from_checkpoint {run_dir}/checkpoint-2`"
    assert f"newest complete checkpoint is {run_dir}/checkpoint-2: resume from it with {resume}" in first_error_line
    trainer._rollout.rollouts.close()
