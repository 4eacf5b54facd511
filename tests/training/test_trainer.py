"""The core trainer on a tiny offline Qwen3: shapes, routing, what changes after a step, and TRL equivalence."""

from __future__ import annotations

import math

import pytest
import torch
from scripted import addition_dataset
from tiny import half_right_answers, tiny_trainer

from trl_multiagent import EvalOpt, OrchWorkers, SingleAgent, Voting
from trl_multiagent.adapters.routing import adapter_parameters
from trl_multiagent.workflows import Workflow, problem_text


def trainer_for(tiny_model_dir, tmp_path, workflow, **overrides):
    """A two-step run of ``workflow`` in ``tmp_path / "out"``, ``overrides`` on top."""
    settings = dict(max_steps=2, logging_steps=1, learning_rate=1e-2, save_strategy="no", seed=0)
    settings.update(overrides)
    return tiny_trainer(tiny_model_dir, tmp_path / "out", workflow, **settings)


def record_episodes(trainer) -> list:
    episodes = []
    run = trainer.engine.run

    def recording_run(prompts):
        result = run(prompts)
        episodes.extend(result)
        return result

    trainer.engine.run = recording_run
    return episodes


def train_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


WORKFLOWS = {
    "single_agent": SingleAgent,
    "eval_opt": lambda: EvalOpt(max_iterations=2),
    "voting": Voting,
    "orch_workers": OrchWorkers,
}


@pytest.mark.parametrize("sharing", ["shared", "isolated"])
@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_builtin_workflow_trains_two_steps(tiny_model_dir, tmp_path, name, sharing):
    workflow = WORKFLOWS[name]()
    trainer = trainer_for(tiny_model_dir, tmp_path, workflow, policy_sharing=sharing)
    episodes = record_episodes(trainer)
    trainer.train()

    expected_adapters = ["shared"] if sharing == "shared" else list(workflow.roles)
    assert list(trainer.model.peft_config) == expected_adapters
    logs = train_logs(trainer)
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["workflow/samples_trained"] == h["workflow/samples_generated"] for h in logs)
    assert len(episodes) == 2 * 4  # 2 steps x (4 episodes on this process)
    for episode in episodes:
        roles = [(c.role, c.instance) for c in episode.calls]
        if name == "single_agent":
            assert roles == [("generator", 0)]
        elif name == "voting":
            assert sorted(roles) == [("aggregator", 0), ("generator", 0), ("generator", 1), ("generator", 2)]
            assert roles[-1] == ("aggregator", 0)
        elif name == "orch_workers":
            assert roles[0] == ("orchestrator", 0) and roles[-1] == ("synthesizer", 0)
            workers = sorted(roles[1:-1])  # one per strategy read from the orchestrator's output
            strategies = trainer.workflow.formats["orchestrator"].read(episode.calls[0].text)
            assert workers == [("worker", i) for i in range(len(strategies))] and 1 <= len(workers) <= 3
            assert episode.final_answer == episode.calls[-1].text
        else:
            assert 2 <= len(roles) <= 4 and len(roles) % 2 == 0
            assert roles == [("generator", 0), ("evaluator", 0)] * (len(roles) // 2)
            assert episode.final_answer == [c for c in episode.calls if c.role == "generator"][-1].text
        for call in episode.calls:
            assert call.adapter == trainer.role_adapters[call.role]


class SometimesHelped(Workflow):
    """The helper is only consulted on hard problems; the solver always answers."""

    roles = ("solver", "helper")

    async def run(self, prompt, generate):
        question = problem_text(prompt)
        if "hard" in question:
            hint = await generate("helper", [{"role": "user", "content": f"Hint for: {question}"}])
            question = f"{question}\nHint: {hint}"
        return await generate("solver", [{"role": "user", "content": question}])


def alternating_yes_no(requests, rng):
    return [
        "hint" if "Hint for" in r.messages[-1]["content"] else ("yes", "no")[i % 2] for i, r in enumerate(requests)
    ]


def hard_is_constant_reward(completions, prompts, **kwargs):
    # Hard problems always score 1: their group has no reward variance, so their samples get zero advantage.
    return [
        1.0 if "hard" in p[-1]["content"] else float("yes" in c[0]["content"]) for p, c in zip(prompts, completions)
    ]


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def helper_trainer(tiny_model_dir, tmp_path, **overrides):
    dataset = addition_dataset(2).map(
        lambda row, i: {
            "prompt": [{"role": "user", "content": ("hard " if i == 0 else "easy ") + row["prompt"][0]["content"]}]
        },
        with_indices=True,
    )  # noqa: E501
    return trainer_for(
        tiny_model_dir,
        tmp_path,
        SometimesHelped(),
        dataset=dataset,
        respond=alternating_yes_no,
        reward_funcs=hard_is_constant_reward,
        max_steps=1,
        per_device_train_batch_size=8,
        **overrides,
    )


def test_isolated_step_moves_only_roles_with_nonzero_advantage(tiny_model_dir, tmp_path):
    trainer = helper_trainer(tiny_model_dir, tmp_path, policy_sharing="isolated")
    before = snapshot(trainer.model)
    trainer.train()
    after = snapshot(trainer.model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    solver = set(adapter_parameters(trainer.model, "solver"))
    helper = set(adapter_parameters(trainer.model, "helper"))
    assert changed and changed <= solver  # the helper only saw zero-advantage episodes; the base never moves
    assert not changed & helper
    assert all("lora_" in n for n in changed)


@pytest.mark.parametrize("sharing", ["isolated", "shared"])
def test_role_with_zero_loss_weight_keeps_its_adapter(tiny_model_dir, tmp_path, sharing):
    trainer = helper_trainer(
        tiny_model_dir, tmp_path, policy_sharing=sharing, role_loss_weights={"solver": 0.0}, beta=0.05
    )
    before = snapshot(trainer.model)
    trainer.train()
    after = snapshot(trainer.model)
    # Every nonzero-advantage sample belongs to the solver, whose weight is 0; the helper's are all zero-advantage
    # and its KL term starts at exactly zero, so nothing moves, under either sharing.
    assert all(torch.equal(before[n], after[n]) for n in before)


def verdict_by_problem(requests, rng):
    # Problem "0 + 2" is always judged Incorrect (the generator retries up to max_iterations), others Correct.
    outputs = []
    for request in requests:
        content = request.messages[-1]["content"]  # the request; the problem is in the first message
        if "\\boxed{Correct}" in content or "verdict" in content.lower() or "evaluat" in content.lower():
            outputs.append(
                "\\boxed{Incorrect}" if "What is 0 + 2" in request.messages[0]["content"] else "\\boxed{Correct}"
            )
        else:
            outputs.append(f"\\boxed{{{rng.randint(1, 4)}}}")
    return outputs


def test_uneven_sample_counts_are_all_trained(tiny_model_dir, tmp_path):
    trainer = trainer_for(
        tiny_model_dir,
        tmp_path,
        EvalOpt(max_iterations=2),
        dataset=addition_dataset(4),
        respond=verdict_by_problem,
        per_device_train_batch_size=3,
        num_generations=3,
        gradient_accumulation_steps=4,
    )
    episodes = record_episodes(trainer)
    trainer.train()
    logs = train_logs(trainer)
    # 12 episodes per step: the 3 of "0 + 2" make 4 calls, the other 9 make 2 -> 30 samples, not a multiple of 4
    assert sorted(len(e.calls) for e in episodes[:12]) == [2] * 9 + [4] * 3
    assert [h["workflow/samples_generated"] for h in logs] == [30.0, 30.0]
    assert [h["workflow/samples_trained"] for h in logs] == [30.0, 30.0]
    sizes = [len(chunk.roles) for chunk in trainer._buffered_micro_batches]
    assert sizes == [8, 8, 7, 7]


def test_every_pending_call_of_a_tick_is_one_backend_batch(tiny_model_dir, tmp_path):
    trainer = trainer_for(
        tiny_model_dir, tmp_path, Voting(), respond=lambda requests, rng: ["\\boxed{1}"] * len(requests), max_steps=1
    )
    backend = trainer.rollout_backend
    backend.batch_sizes.clear()  # drop the construction-time check
    trainer.train()
    assert backend.batch_sizes == [12, 4]  # 4 episodes x 3 voters in one batch, then the 4 aggregators


def test_a_trainer_trains_again(tiny_model_dir, tmp_path):
    """A second `train()` builds a new LR scheduler around the optimizer whose step the adapters' updates hook."""
    trainer = trainer_for(tiny_model_dir, tmp_path, Voting(), max_steps=1, respond=half_right_answers)
    trainer.train()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.train()
    assert trainer.state.global_step == 1 and len(train_logs(trainer)) == 1
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if "lora_" in n)
