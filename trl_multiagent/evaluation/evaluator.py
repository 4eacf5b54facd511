"""Evaluate a workflow on a task's held-out split: k episodes per problem, the task reward, pass@1 and pass@k.

``evaluate`` walks a run's checkpoints in step order and appends one row per checkpoint to
``<output_dir>/eval_results.jsonl``; a checkpoint already evaluated with the same settings is skipped before any
weight is loaded. Every episode is written to ``<output_dir>/episodes/step-N/<mode>-<workflow>-<key>/``.
"""

from __future__ import annotations

import gc
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import set_seed

from ..checkpoints import TrainedWorkflow
from ..common.model_names import resolve_model_name
from ..config.multiagent_grpo_config import ROLLOUT_BACKENDS, config_field
from ..monitoring.pass_at_k import pass_at_k
from ..rollout.chat_rendering import check_chat_rendering
from ..rollout.engine import RolloutEngine
from ..rollout.records import Episode
from ..tasks import TASKS, get_task
from ..workflows import SingleAgent, Workflow
from ..workflows.correctness import solved
from .best_of import SELECTIONS, matched_best_of, select
from .episodes import episode_record, write_episode
from .generation import eos_token_ids, eval_role_tools, make_generation_config, run_episodes
from .judged import Judge, JudgedSamples, judged_samples
from .modes import ModePlan, plan_mode
from .results import RESULTS_FILE, append_result, key_hash, read_results, result_key
from .run_checkpoints import list_checkpoints


@dataclass
class EvalSettings:
    """How to evaluate; every field but ``device``, ``dtype`` and the batch sizes is part of a result's key."""

    task: str = field(
        default="math", metadata={"help": "'math' or 'code': the test split and reward.", "choices": list(TASKS)}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub id, local .jsonl/.parquet, or 'arithmetic' / 'toy_code'; default: the task's dataset."},
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate the first `limit` problems of the split."})
    k: int = field(default=1, metadata={"help": "Episodes per problem; reports pass@1 (mean over k) and pass@k."})
    # Greedy unless asked, where training samples at TRL's 1.0: a setting of its own.
    temperature: float = field(default=0.0, metadata={"help": "0: greedy (needs k=1); the paper samples at 0.7."})
    top_p: float = config_field("top_p")
    max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per model call; default: the paper's evaluation lengths (8192 math, 5120 code), or its "
            "training lengths (5120, 2048) with use_training_lengths."
        },
    )
    use_training_lengths: bool = field(
        default=False,
        metadata={"help": "Without max_completion_length: evaluate at the training lengths (5120 math, 2048 code)."},
    )
    seed: int = config_field("seed", help="Sampling seed, reset before each checkpoint.")
    best_of: int = field(
        default=1,
        metadata={
            "help": "A single-agent evaluation: each of the k episodes is best_of independent samples, one of whose "
            "answers `select` chooses and the task grades (the cost-matched baseline); needs temperature > 0."
        },
    )
    select: str = field(
        default="majority",
        metadata={
            "help": "With best_of > 1, how the answer is chosen: 'majority', the most frequent parsed final answer "
            "(whitespace ignored; a tie goes to the answer seen first; unparseable answers do not vote); 'judge', "
            "the majority among the samples that `judge`'s trained evaluator accepts (none: among all).",
            "choices": list(SELECTIONS),
        },
    )
    judge: str | None = field(
        default=None,
        metadata={
            "help": "With select='judge': an Eval-Opt run (or checkpoint) whose newest evaluator adapter judges each "
            "sample as it judges a first attempt (the judged best-of-n; 2 best_of calls per episode)."
        },
    )
    rollout_batch_size: int | None = config_field("rollout_batch_size")
    episodes_per_batch: int = field(default=256, metadata={"help": "Episodes run concurrently."})
    # Render and sample as the run was trained: the training settings of the same names.
    chat_template_kwargs: dict | str | None = config_field("chat_template_kwargs")
    role_generation_kwargs: dict[str, dict[str, Any]] | str | None = config_field("role_generation_kwargs")
    chat_rendering: str = config_field("chat_rendering")
    rollout_backend: str = config_field(
        "rollout_backend",
        help="'transformers', or 'vllm': one vLLM engine (base model + every role adapter as a LoRA) serves every "
        "checkpoint's episodes; needs vLLM (`pip install -e '.[vllm]'` in the clone).",
    )
    vllm_engine_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": 'JSON for vllm.LLM, e.g. \'{"gpu_memory_utilization": 0.9, "max_model_len": 8192}\'.'},
    )
    max_tool_calling_iterations: int | None = config_field("max_tool_calling_iterations")
    tool_timeout: float = config_field("tool_timeout")
    device: str | None = field(default=None, metadata={"help": "Default: cuda when available, else cpu."})
    dtype: str | None = field(default=None, metadata={"help": "e.g. bfloat16; default: the checkpoint's own."})

    def __post_init__(self):
        task = get_task(self.task)
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}.")
        if self.k > 1 and self.temperature <= 0:
            raise ValueError(
                f"Greedy decoding (temperature=0) repeats one answer {self.k} times; set temperature > 0 for k > 1 "
                "(the paper trains at 0.7)."
            )
        if self.best_of < 1:
            raise ValueError(f"best_of must be >= 1, got {self.best_of}.")
        if self.best_of > 1 and self.temperature <= 0:
            raise ValueError(
                f"Greedy decoding (temperature=0) gives best_of={self.best_of} identical samples; set temperature > 0."
            )
        if self.select not in SELECTIONS:
            raise ValueError(f"select must be one of {SELECTIONS}, got {self.select!r}.")
        if (self.select == "judge") != (self.judge is not None):
            raise ValueError(
                "select='judge' and judge go together: the judge is an Eval-Opt run whose evaluator chooses among "
                f"the samples (got select={self.select!r}, judge={self.judge!r})."
            )
        if self.max_completion_length is None:
            self.max_completion_length = task.training_length if self.use_training_lengths else task.eval_length
        if isinstance(self.chat_template_kwargs, str):
            self.chat_template_kwargs = json.loads(self.chat_template_kwargs)
        if isinstance(self.role_generation_kwargs, str):
            self.role_generation_kwargs = json.loads(self.role_generation_kwargs)
        check_chat_rendering(self.chat_rendering, self.chat_template_kwargs)
        if isinstance(self.vllm_engine_kwargs, str):
            self.vllm_engine_kwargs = json.loads(self.vllm_engine_kwargs)
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"rollout_backend must be one of {ROLLOUT_BACKENDS}, got {self.rollout_backend!r}.")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"


def evaluate(
    run_dir: str | Path | None = None,
    mode: str = "trained",
    settings: EvalSettings | None = None,
    output_dir: str | Path | None = None,
    workflow: Workflow | None = None,
    base_model: str | None = None,
    alone_role: str = "generator",
    role_tools: dict[str, list[Callable]] | None = None,
    role_policies: dict[str, str] | None = None,
    final_only: bool = False,
    best_of_calls: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Evaluate every checkpoint of ``run_dir`` in ``mode`` (once, at step 0, for ``base``; only the newest with
    ``final_only``); return the new rows.

    See ``modes.py`` for the modes. Results go to ``output_dir`` (default: ``run_dir``). ``role_tools``
    (``{role: [function, ...]}``): tools for roles, added to those the workflow declares, as the trainer's.
    ``role_policies`` (trained mode): role type -> ``"trained"``, ``"base"`` or another checkpoint folder, e.g.
    ``{"evaluator": "base"}``. ``best_of_calls``: a workflow run (or checkpoint) folder whose newest evaluation with
    these settings sets ``settings.best_of`` to its measured model calls per episode, rounded up (the cost-matched
    single-agent baseline; see ``best_of.py``); the row records that evaluation as ``best_of_calls_of``.
    """
    settings = settings or EvalSettings()
    if best_of_calls is not None and settings.best_of > 1:
        raise ValueError("best_of_calls sets best_of from a workflow's measured calls: give one of the two.")
    if output_dir is None and run_dir is None:
        raise ValueError("Pass output_dir= (where eval_results.jsonl goes) when evaluating without a run_dir.")
    output_dir = Path(output_dir if output_dir is not None else run_dir)
    checkpoints = list_checkpoints(run_dir) if run_dir is not None else [(0, None)]
    if mode == "base":  # the checkpoint only names the workflow and base model
        checkpoints = [(0, checkpoints[-1][1])]
    elif final_only:
        checkpoints = checkpoints[-1:]
    dataset = get_task(settings.task).eval_dataset(settings.dataset_name, settings.limit)
    done = {result_key(row) for row in read_results(output_dir / RESULTS_FILE)}
    # one judge for every checkpoint, resolved (and checked) before any is evaluated
    judge = Judge.of(settings.judge) if settings.select == "judge" else None
    new_rows, engine = [], None
    for step, checkpoint in tqdm(
        checkpoints, desc=f"{mode}: checkpoints", unit="checkpoint", disable=len(checkpoints) < 2
    ):
        plan = plan_mode(
            mode, str(checkpoint) if checkpoint else None, workflow, base_model, alone_role, role_policies
        )
        matched = None
        if best_of_calls is not None:
            like = describe(plan, settings, step, run_dir, len(dataset))
            n, matched = matched_best_of(read_results(best_of_calls), like, str(best_of_calls))
            settings = replace(settings, best_of=n)
        if settings.best_of > 1 and not isinstance(plan.workflow, SingleAgent):
            raise ValueError(
                f"best_of samples one agent several times; {mode} mode runs {type(plan.workflow).__name__}. Evaluate "
                "a single-agent (SA-RL) run in trained mode, or a workflow's role with --mode generator_alone."
            )
        row = describe(plan, settings, step, run_dir, len(dataset))
        scored_plan, scored_settings = plan, settings
        if judge is not None:
            if settings.best_of < 2:
                raise ValueError("A judged best-of-n needs n > 1 samples: give --best_of n or --best_of_calls RUN.")
            scored_plan, scored_settings = judge.plan(plan, settings.best_of), replace(settings, best_of=1)
            # the judge's checkpoint is part of the key: a judge run trained further is a new judge
            row.update(judge=str(judge.checkpoint), judge_of=judge.record())
        if matched is not None:
            row["best_of_calls_of"] = {
                "run": matched.get("run"),
                "workflow": matched["workflow"],
                "policy_sharing": matched.get("policy_sharing"),
                "step": matched["step"],
                "mean_calls": matched["mean_calls"],
            }
        if result_key(row) in done:
            continue
        episodes_dir = output_dir / "episodes" / f"step-{step}" / f"{mode}-{row['workflow']}-{key_hash(row)}"
        # with vLLM the transformers model only hands its adapters over: it stays on the CPU
        trained = scored_plan.load("cpu" if settings.rollout_backend == "vllm" else settings.device, settings.dtype)
        if settings.rollout_backend == "vllm":  # one engine for every checkpoint: only the adapters change
            engine = engine or vllm_backend(trained, plan.model, settings)
            engine.sync_adapters(_with_lora(trained.model))
        row.update(score(trained, dataset, scored_settings, episodes_dir, engine, role_tools=role_tools))
        del trained
        gc.collect()  # release this checkpoint's model before loading the next one
        row["episodes_dir"] = str(episodes_dir)
        append_result(output_dir / RESULTS_FILE, row)
        done.add(result_key(row))
        new_rows.append(row)
    return new_rows


def describe(
    plan: ModePlan, settings: EvalSettings, step: int, run_dir: str | Path | None, num_problems: int
) -> dict[str, Any]:
    """A result row's identity: what ran, on what, how (no scores yet)."""
    return {
        "run": Path(run_dir).resolve().name if run_dir is not None else None,
        "step": step,
        "mode": plan.mode,
        "model": plan.model,
        "workflow": type(plan.workflow).__name__,
        "workflow_config": plan.workflow.config_dict(),
        "trained_workflow": plan.trained_workflow,
        "role_to_adapter": plan.role_to_adapter,
        "policy_sharing": plan.policy_sharing,
        "checkpoint": plan.checkpoint,
        "task": settings.task,
        "dataset": settings.dataset_name or get_task(settings.task).dataset_id,
        "num_problems": num_problems,
        **{name: getattr(settings, name) for name in ("k", "temperature", "top_p", "max_completion_length", "seed")},
        # only when not the default, so rows recorded before this field existed keep their identity
        **({"rollout_backend": settings.rollout_backend} if settings.rollout_backend != "transformers" else {}),
        **({"chat_rendering": settings.chat_rendering} if settings.chat_rendering != "tokenizer" else {}),
        **({"role_policies": format_role_policies(plan.role_policies)} if plan.role_policies else {}),
        **({"best_of": settings.best_of, "select": settings.select} if settings.best_of > 1 else {}),
    }


def format_role_policies(policies: dict[str, str]) -> str:
    """``{"evaluator": "base"}`` -> ``"evaluator=base"``: the mix of trained and base roles a row (and cell) ran."""
    return ",".join(f"{role}={policy}" for role, policy in sorted(policies.items()))


def vllm_backend(trained: TrainedWorkflow, base_model: str, settings: EvalSettings):
    """A vLLM engine on the base model serving ``trained``'s adapters (LoRA rank read from them)."""
    from ..rollout.backends.vllm_backend import VLLMBackend

    model = _with_lora(trained.model)
    adapters = [name for name in model.peft_config if name in set(trained.role_to_adapter.values())]
    sampling = {"max_tokens": settings.max_completion_length, "temperature": settings.temperature}
    if settings.temperature > 0:
        sampling["top_p"] = settings.top_p
    engine_kwargs = {"seed": settings.seed, **({"dtype": settings.dtype} if settings.dtype else {})}
    return VLLMBackend(
        resolve_model_name(base_model),
        trained.tokenizer,
        adapters,
        lora_rank=max(config.r for config in model.peft_config.values()),
        sampling=sampling,
        eos_token_ids=eos_token_ids(trained),
        chat_template_kwargs=settings.chat_template_kwargs,
        chat_rendering=settings.chat_rendering,
        **{**engine_kwargs, **(settings.vllm_engine_kwargs or {})},
    )


def _with_lora(model: torch.nn.Module):
    """The PEFT model; the bare base model (base mode) gets a throwaway LoRA, whose zero copy serves ``__base__``."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if not isinstance(model, PeftModel):
        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"), adapter_name="unused")
    return model


def score(
    trained: TrainedWorkflow,
    dataset: Dataset,
    settings: EvalSettings,
    episodes_dir: Path | None = None,
    backend=None,
    *,
    role_tools: dict[str, list[Callable]] | None = None,
) -> dict[str, Any]:
    """Run ``k`` episodes per problem, reward each final answer, and summarise (success: ``solved``, a reward of at
    least 1).

    With ``settings.best_of`` = n > 1 (a single agent), each of the ``k`` episodes is n samples of which
    ``settings.select`` chooses one (``best_of.py``); the chosen sample's reward is the episode's, and the row also
    records the samples' own success (``sample_accuracy``). ``mean_calls`` is per episode, all n samples' calls.

    ``backend``: a synced ``VLLMBackend`` to generate with; by default the transformers backend of ``run_episodes``.
    """
    rows = dataset.to_list()
    reward_func = get_task(settings.task).make_reward()
    n = settings.best_of
    answer_format = trained.workflow.formats[trained.workflow.roles[0]] if n > 1 else None
    rewards, answers, calls, truncated = [], [], 0, 0
    judging = isinstance(trained.workflow, JudgedSamples)
    sample_solved, accepted = [], []
    role_tokens: dict[str, list[int]] = defaultdict(list)
    total = len(rows) * settings.k * n
    progress = tqdm(total=total, desc=f"{type(trained.workflow).__name__}: episodes", unit="episode")
    for chunk, episodes in sample_episodes(trained, rows, settings, backend, role_tools=role_tools):
        chunk_rewards = final_answer_rewards(reward_func, episodes, [rows[problem] for problem, _ in chunk])
        for (problem, sample), episode, reward in zip(chunk, episodes, chunk_rewards):
            calls += len(episode.calls)
            truncated += sum(call.truncated for call in episode.calls)
            for call in episode.calls:
                role_tokens[call.role].append(len(call.completion_ids))
            if answer_format is not None:
                answers.append(None if episode.final_answer is None else answer_format.parse(episode.final_answer))
            if episodes_dir is not None:
                record = episode_record(episode, rows[problem], sample, reward, trained.workflow, settings.task)
                write_episode(episodes_dir, problem, record)
        if judging:
            graded, verdicts = judged_samples(reward_func, episodes, [rows[p] for p, _ in chunk], trained.workflow)
            sample_solved, accepted = sample_solved + graded, accepted + verdicts
        rewards += chunk_rewards
        progress.update(len(chunk))
        progress.set_postfix(success=f"{sum(map(solved, rewards)) / len(rewards):.3f}")
    progress.close()
    sample_rewards = rewards
    if n > 1:  # samples are problem-major, each episode's n samples in a row: keep the chosen one's reward
        groups = range(0, len(rewards), n)
        rewards = [rewards[start + select(answers[start : start + n], settings.select)] for start in groups]
    k, jobs = settings.k, len(rewards)
    correct = [sum(map(solved, rewards[p * k : (p + 1) * k])) for p in range(len(rows))]
    result = {
        "accuracy": sum(correct) / max(jobs, 1),  # pass@1, averaged over the k samples
        "pass_at_k": sum(pass_at_k(k, c, k) for c in correct) / max(len(rows), 1),
        "mean_reward": sum(rewards) / max(jobs, 1),
        "mean_calls": calls / max(jobs, 1),
        "truncated_fraction": truncated / max(calls, 1),
        "role_completion_tokens": {role: sum(t) / len(t) for role, t in sorted(role_tokens.items())},
        "problem_solved": correct,  # per problem, in dataset order: episodes solved out of k
    }
    if n > 1:
        result["sample_accuracy"] = sum(map(solved, sample_rewards)) / max(len(sample_rewards), 1)
    if judging:  # the samples graded one by one, and how the judge's verdicts matched those grades
        agree = [ok == good for ok, good in zip(accepted, sample_solved)]
        result["sample_accuracy"] = sum(sample_solved) / max(len(sample_solved), 1)
        result["judge_accepted"] = sum(accepted) / max(len(accepted), 1)
        result["judge_agreement"] = sum(agree) / max(len(agree), 1)
    return result


def sample_episodes(
    trained: TrainedWorkflow,
    rows: list[dict[str, Any]],
    settings: EvalSettings,
    backend=None,
    *,
    role_tools: dict[str, list[Callable]] | None = None,
) -> Iterator[tuple[list[tuple[int, int]], list[Episode]]]:
    """``k`` episodes per row (``k * best_of`` samples with ``best_of``; problem-major), ``episodes_per_batch`` at a
    time: each batch's ``(problem, sample)`` pairs and episodes. The seed is set once, before the first batch. Roles
    with tools (the workflow's, plus ``role_tools``) run their tool loops as in training."""
    set_seed(settings.seed)
    generation_config = make_generation_config(
        trained, settings.max_completion_length, settings.temperature, settings.top_p
    )
    tools = eval_role_tools(trained, settings, role_tools)
    jobs = [(problem, sample) for problem in range(len(rows)) for sample in range(settings.k * settings.best_of)]
    for start in range(0, len(jobs), settings.episodes_per_batch):
        chunk = jobs[start : start + settings.episodes_per_batch]
        prompts = [rows[problem]["prompt"] for problem, _ in chunk]
        if backend is not None:
            engine = RolloutEngine(
                trained.workflow,
                backend,
                trained.role_to_adapter,
                settings.role_generation_kwargs,
                role_tools=tools,
            )
            episodes = engine.run(prompts)
        else:
            episodes = run_episodes(
                trained,
                prompts,
                generation_config,
                rollout_batch_size=settings.rollout_batch_size,
                chat_template_kwargs=settings.chat_template_kwargs,
                role_generation_kwargs=settings.role_generation_kwargs,
                chat_rendering=settings.chat_rendering,
                role_tools=tools,
            )
        yield chunk, episodes


def final_answer_rewards(reward_func: Callable, episodes: list[Episode], rows: list[dict[str, Any]]) -> list[float]:
    """The task reward of each episode's final answer against its row (None or NaN: 0), given as in training (a
    role with tools that answered: its whole tool conversation)."""
    columns = {name: [row[name] for row in rows] for name in rows[0] if name != "prompt"}
    completions = [
        conversation.messages
        if (conversation := episode.answering_conversation()) is not None
        else [{"role": "assistant", "content": episode.final_answer}]
        for episode in episodes
    ]
    rewards = reward_func(prompts=[row["prompt"] for row in rows], completions=completions, **columns)
    return [0.0 if r is None or math.isnan(r) else float(r) for r in rewards]
