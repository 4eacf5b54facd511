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


# ------------------------------------------------------------------------------ the update's mini-batches (verl)
def verl_partitions(weights: list[int], k: int) -> list[list[int]]:
    """verl's ``get_seqlen_balanced_partitions(weights, k, equal_size=True)`` (verl/utils/seqlen_balancing.py:37-202,
    v0.6.1), restated: positions ranked by (weight, position) are dealt k at a time into candidates of k one-item
    sets; a set orders by (sum, size, its items as (position, weight) in the order they joined); a candidate keeps
    its sets heaviest first and ranks by (spread = heaviest - lightest sum, heaviest set); while more than one is
    left, the two highest-ranked are taken and the first absorbs the second, heaviest set with lightest, second with
    second lightest, and so on. The last candidate's sets, heaviest first, each as sorted positions."""

    def set_rank(items):
        return sum(w for _, w in items), len(items), items

    def candidate_rank(sets):
        return set_rank(sets[0])[0] - set_rank(sets[-1])[0], set_rank(sets[0])

    ranked = sorted((w, i) for i, w in enumerate(weights))
    candidates = [
        sorted(([(i, w)] for w, i in ranked[start : start + k]), key=set_rank, reverse=True)
        for start in range(0, len(ranked), k)
    ]
    while len(candidates) > 1:
        candidates.sort(key=candidate_rank, reverse=True)
        first, second = candidates[0], candidates[1]
        merged = sorted((a + b for a, b in zip(first, second[::-1])), key=set_rank, reverse=True)
        candidates = [merged, *candidates[2:]]
    return [sorted(i for i, _ in items) for items in candidates[0]]


def verl_update_mini_batches(lengths: list[int], agents: list[str], mini_batch: int, gpus: int) -> list[tuple]:
    """The samples of each optimizer step of the reference's update of one batch (positions in ``lengths``, padding
    copies left out), agent by agent, on ``gpus`` ranks:

    - rLLM pads the batch to a multiple of the ranks with copies of its first samples
      (rllm/trainer/verl/agent_workflow_trainer.py:531,1023-1055; verl/protocol.py:73-98);
    - verl's ``_balance_batch`` (verl/trainer/ppo/ray_trainer.py:919-950): each sample weighs 24576 L + L^2
      (seqlen_balancing.py:27-34), the batch is cut into balanced partitions, one per rank (``verl_partitions``), each
      sorted by (weight, position) and laid out as its items 0, 2, 4, ... then ..., 5, 3, 1; partitions concatenated;
    - rLLM's split per agent in that order, agents as they first appear, each padded to a multiple of the ranks with
      copies of its first samples (agent_workflow_trainer.py:133-178,558,576);
    - each rank gets a contiguous equal share of an agent's samples and cuts it into mini-batches of
      ``mini_batch // gpus`` (verl/workers/fsdp_workers.py:235-236; dp_actor.py:404): step k holds every rank's k-th.
    """
    batch = [(i, False) for i in range(len(lengths))]
    batch += [(batch[j % len(batch)][0], True) for j in range(-len(batch) % gpus)]
    weight = [24576 * lengths[i] + lengths[i] ** 2 for i, _ in batch]
    laid_out = []
    for part in verl_partitions(weight, gpus):
        part = sorted(part, key=lambda p: (weight[p], p))
        laid_out += part[0::2] + part[1::2][::-1]
    per_agent: dict[str, list] = {}
    for p in laid_out:
        per_agent.setdefault(agents[batch[p][0]], []).append(batch[p])
    steps = []
    for agent, samples in per_agent.items():
        samples = samples + [(samples[j % len(samples)][0], True) for j in range(-len(samples) % gpus)]
        share, per_rank = len(samples) // gpus, mini_batch // gpus
        shares = [samples[r * share : (r + 1) * share] for r in range(gpus)]
        for k in range(0, share, per_rank):
            steps.append((agent, [i for s in shares for i, copy in s[k : k + per_rank] if not copy]))
    return steps


# --------------------------------------------------------------------------------------------- the code problem
def livecodebench_question(problem: str, starter_code: str | None, sentences: dict[str, str]) -> str:
    """The reference's text of a DeepCoder problem (its ``question``), laid out as
    ``fetch_live_code_bench_system_prompt`` lays it out (rllm/data/utils.py:66-76; called at
    examples/deepcoder/prepare_deepcoder_data.py:58-60 with the row's ``starter_code``, or None when it is empty or
    absent), with the sentences given: the system sentence, a blank line, the problem with nothing after it, then
    either the format line for starter code and the starter code in a python block, or the format line for standard
    input and a placeholder block, each block followed by a blank line, and the answer line with a blank line after
    it."""
    if starter_code:
        form, code = sentences["format_with_starter_code"], starter_code
    else:
        form, code = sentences["format_without_starter_code"], sentences["code_placeholder"]
    block = "```python\n" + code + "\n```\n\n"
    return sentences["system"] + "\n\n" + problem + form + "\n" + block + sentences["answer"] + "\n\n"
