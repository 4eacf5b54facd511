"""The reference stack's GRPO advantages and per-role rewards, written out from its code (github
XHMY/marl-llm-workflows, rLLM on verl) so that tests compare ours against them. Paths are in that repository.

Groups: rLLM makes every model call a one-step trajectory with its own reward and gives it the uid
`{task}_{trajectory name}_step0` (rllm/engine/agent_workflow_engine.py:316,389; the trainer sets uid = step_ids,
rllm/trainer/verl/agent_workflow_trainer.py:473; stepwise per_step: rllm/trainer/config/multi_agent_ppo_trainer.yaml:
111-113); a prompt's 8 episodes share the task id (agent_workflow_trainer.py:253-254).
"""

from __future__ import annotations

import math
import re


def verl_grpo(uids: list, scores: list[float]) -> list[float]:
    """verl's GRPO advantage with norm_adv_by_std_in_grpo (verl/trainer/ppo/core_algos.py:311-325): per uid the mean
    and the unbiased std, eps 1e-6; a uid with one sample gets mean 0 and std 1."""
    by_uid: dict = {}
    for uid, score in zip(uids, scores):
        by_uid.setdefault(uid, []).append(score)
    stats = {}
    for uid, xs in by_uid.items():
        mean = sum(xs) / len(xs) if len(xs) > 1 else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 1.0
        stats[uid] = (mean, std)
    return [(score - stats[uid][0]) / (stats[uid][1] + 1e-6) for uid, score in zip(uids, scores)]


def reference_name(workflow: str, role: str, instance: int) -> str:
    """The reference's trajectory name of a call: math voters generator0/1/2 (rllm/workflows/voting_workflow.py:214),
    code voters all generator (examples/deepcoder/deepcoder_voting_workflow.py:245), every Orch-Workers worker
    worker (rllm/workflows/orchestrator_workers_workflow.py:379), each Eval-Opt call its role
    (rllm/workflows/evaluator_optimizer_workflow.py:302,358,410)."""
    return f"generator{instance}" if (workflow, role) == ("voting_math", "generator") else role


def reference_advantages(episodes, num_generations: int, workflow: str, scores: list[float]) -> list[float]:
    """verl's advantage of every call of ``episodes`` (in call order; ``episode.index`` over all processes) over the
    reference's uids, ``scores`` one per call."""
    uids = [
        (e.index // num_generations, reference_name(workflow, c.role, c.instance)) for e in episodes for c in e.calls
    ]
    return verl_grpo(uids, scores)


def right(text: str, answer: str) -> bool:
    """A math answer is right when its last boxed number is the answer (the tests' problems are additions)."""
    boxes = re.findall(r"\\boxed\{(\d+)\}", text)
    return bool(boxes) and boxes[-1] == answer


def reference_role_rewards(episode, answer: str) -> list[float]:
    """The reference's per-role reward (its use_final_outcome_reward=False) of every call of a math episode:
    generator / voter / synthesizer: its own answer right (rllm/workflows/evaluator_optimizer_workflow.py:300,408;
    voting_workflow.py:258-260; orchestrator_workers_workflow.py:526,544); evaluator: 1 when its verdict, the first
    `\\boxed{Correct|Incorrect}` (else "unknown"), matches whether the attempt it judged is right
    (examples/math_reasoning/evaluator_optimizer_math_workflow.py:183-193,244-247); aggregator: the answer it selected
    right (voting_workflow.py:281-287); orchestrator and workers: 0 (orchestrator_workers_workflow.py:290-332)."""
    rewards, attempt, voters = [], None, []
    for call in episode.calls:
        if call.role in ("generator", "synthesizer"):
            rewards.append(float(right(call.text, answer)))
            attempt = call.text
            voters.append(call.text)
        elif call.role == "evaluator":
            found = re.search(r"\\boxed\{(Correct|Incorrect)\}", call.text, re.IGNORECASE)
            verdict = found.group(1).lower() if found else "unknown"
            judged = right(attempt, answer)
            rewards.append(float((verdict == "correct" and judged) or (verdict == "incorrect" and not judged)))
        elif call.role == "aggregator":
            pick = int(re.search(r"\\boxed\{(\d+)\}", call.text).group(1)) - 1
            rewards.append(float(right(voters[pick], answer)))
        elif call.role in ("orchestrator", "worker"):
            rewards.append(0.0)
        else:
            raise ValueError(f"No reference rule for role {call.role!r}.")
    return rewards
