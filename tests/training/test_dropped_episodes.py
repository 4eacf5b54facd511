"""An episode ended by a prompt over `max_prompt_length` leaves training whole, as in the reference: its trainer
builds the batch from the episodes' trajectories and an episode without any is left out before the advantages are
computed (rllm/engine/agent_workflow_engine.py:298-312), so the GRPO groups are those of the remaining calls
(`reference_rules.verl_grpo` over them). The paper presets set the reference's limit per workflow."""

from __future__ import annotations

import math
import re
import statistics

import pytest
from presets import ON_CPU, recipe_trainer_kwargs
from reference_rules import reference_advantages, verl_grpo
from scripted import ScriptedBackend, addition_dataset
from tiny import tiny_trainer, train_recording
from transformers import AutoTokenizer

from trl_multiagent import EvalOpt
from trl_multiagent.rollout.chat_rendering import ChatRenderer
from trl_multiagent.rollout.engine import RolloutEngine

PADDING = " because" * 200


def answers(padded: bool):
    """Generators answer "What is i + 2?" right or wrong at random, with a long explanation when ``padded`` and at
    random; the evaluator accepts every attempt."""

    def respond(requests, rng) -> list[str]:
        outputs = []
        for request in requests:
            if request.adapter == "evaluator":
                outputs.append("\\boxed{Correct}")
                continue
            i = int(re.search(r"What is (\d+) \+ 2", request.messages[0]["content"]).group(1))
            answer = f"\\boxed{{{i + 2 if rng.random() < 0.5 else i + 3}}}"
            outputs.append(answer + (PADDING if padded and rng.random() < 0.4 else ""))
        return outputs

    return respond


@pytest.mark.parametrize("groups", ["calls", "episodes"])
def test_a_dropped_episode_leaves_its_calls_and_its_groups(tiny_model_dir, tmp_path, groups):
    """Eval-Opt (one attempt, one verdict), 2 problems x 8 episodes; an attempt with a long explanation makes its
    evaluator's prompt too long, which ends the episode. The batch holds the calls of the other episodes only, each
    call's advantage is verl's over the remaining calls of its problem and role (the paper's groups) or TRL's over
    the remaining episodes of its problem (the library's), and the step logs how many were dropped."""
    workflow = EvalOpt(max_iterations=1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = addition_dataset(2)
    short = RolloutEngine(workflow, ScriptedBackend(tokenizer, answers(False)), {r: r for r in workflow.roles})
    calls = [c for e in short.run([row["prompt"] for row in rows]) for c in e.calls]
    limit = max(len(ChatRenderer(tokenizer).prompt_ids(c.messages)) for c in calls) + 10  # every short one fits

    trainer = tiny_trainer(
        tiny_model_dir,
        tmp_path,
        workflow,
        dataset=rows,
        respond=answers(True),
        num_generations=8,
        per_device_train_batch_size=16,
        advantage_groups=groups,
        max_prompt_length=limit,
        max_steps=1,
        policy_sharing="isolated",
        save_strategy="no",
        seed=0,
    )
    (batch,), episodes = train_recording(trainer)
    dropped = [e for e in episodes if e.dropped]
    kept = [e for e in episodes if not e.dropped]
    for problem in range(2):  # each problem keeps some of its episodes and loses some
        assert 0 < sum(e.dropped for e in episodes[8 * problem : 8 * problem + 8]) < 8
    assert all(e.calls == [] for e in dropped) and all(len(e.calls) == 2 for e in kept)
    assert len(batch) == sum(len(e.calls) for e in kept)

    score = {e.index: float(str(rows[e.index // 8]["answer"]) in e.final_answer) for e in kept}
    if groups == "calls":
        expected = reference_advantages(kept, 8, "eval_opt_math", [score[e.index] for e in kept for _ in e.calls])
        # Counting the dropped episodes as failures (reward 0) in their groups would give other advantages.
        keys = [(e.index // 8, c.role) for e in kept for c in e.calls] + [(e.index // 8, "generator") for e in dropped]
        counted = verl_grpo(keys, [score[e.index] for e in kept for _ in e.calls] + [0.0] * len(dropped))
    else:  # TRL's: mean and std over the problem's remaining episodes, eps 1e-4
        expected, counted = [], []
        for e in kept:
            same = [score[k.index] for k in kept if k.index // 8 == e.index // 8]
            mean, std = statistics.mean(same), statistics.stdev(same)
            expected += [(score[e.index] - mean) / (std + 1e-4)] * len(e.calls)
            with_dropped = same + [0.0] * sum(d.index // 8 == e.index // 8 for d in dropped)
            counted += [(score[e.index] - statistics.mean(with_dropped)) / (statistics.stdev(with_dropped) + 1e-4)] * 2
    assert batch.advantages.tolist() == pytest.approx(expected, abs=1e-4)
    assert not all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(counted, expected))
    assert trainer.state.log_history[0]["workflow/dropped_episodes"] == len(dropped)


# The reference's per-workflow prompt limits (dashboard/task_configs.py: math 27-34, code 91-98), which its launcher
# passes as data.max_prompt_length (dashboard/launch_experiment.sh:304).
REFERENCE_LIMITS = {
    "math": {"eval_opt": 30720, "voting": 20480, "orch_workers": 20480, "single_agent": 15360},
    "code": {"eval_opt": 10240, "voting": 10240, "orch_workers": 10240, "single_agent": 4096},
}


@pytest.mark.parametrize("task", ["math", "code"])
def test_the_paper_presets_end_episodes_at_the_references_prompt_limits(task):
    offline = "toy_code" if task == "code" else "arithmetic"
    for workflow, limit in REFERENCE_LIMITS[task].items():
        argv = ("--output_dir", "unused", *ON_CPU, "--dataset_name", offline)
        kwargs = recipe_trainer_kwargs(f"{workflow}_{task}", *argv)
        assert kwargs["args"].prompt_limit_for(type(kwargs["workflow"])) == limit, (workflow, task)
