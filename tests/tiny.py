"""The tiny CPU training run the trainer tests share: its config, its LoRA and its trainer.

``CPU_SETTINGS`` are what every tiny run has in common; each test passes the rest (steps, learning rate, saving,
seed, sharing) by name, so the settings its assertions depend on stand where it builds the trainer.
"""

from __future__ import annotations

import re

from peft import LoraConfig
from scripted import ScriptedBackend, addition_dataset, boxed_answer_reward
from transformers import AutoTokenizer

from trl_multiagent import MultiAgentGRPOConfig, MultiAgentGRPOTrainer, Voting

CPU_SETTINGS = dict(
    use_cpu=True,
    bf16=False,
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    report_to="none",
)


# The paper preset's update (recipes/configs/paper_math.yaml): sequential mini-batches per adapter in verl's order,
# each adapter clipped on its own, the scheduler stepped once per adapter update call, GRPO groups per call, weight
# decay, its loss's clip-high and ratio cap.
PAPER_UPDATE = (
    "update_schedule",
    "mini_batch_order",
    "clip_grad_norm_per_adapter",
    "max_grad_norm",
    "lr_scheduler_steps",
    "advantage_groups",
    "weight_decay",
    "epsilon_high",
    "delta",
)
# One step of plain SGD at a large rate, with no gradient clipping, no checkpoint and no summary picture: the update
# that tests compare gradient by gradient across two ways of computing it.
ONE_SGD_STEP = dict(
    max_steps=1,
    logging_steps=1,
    learning_rate=0.05,
    optim="sgd",
    max_grad_norm=0.0,
    save_strategy="no",
    training_summary=False,
    seed=0,
)
# The tiny runs' model calls hold 81 to 266 tokens: one to three of them per forward.
TINY_TOKEN_BOUND = 300


def update_settings(update: str) -> dict:
    """The settings of an update a test names: ``"merged"`` or ``"mini_batches"`` (that schedule, the rest the
    trainer's defaults); ``"paper"``: the paper preset's update (``PAPER_UPDATE``) at tiny size: mini-batches of one
    prompt's episodes (several per adapter and step), at most ``TINY_TOKEN_BOUND`` tokens per forward (the preset's
    51,200 at its scale), and a cosine that ends at half the rate (the preset's reaches 0 by the second of two steps
    when stepped per update call, and nothing would move then); ``"clip_merged"``: the merged schedule with the
    paper's per-adapter clipping (at a norm the tiny runs reach), token bound and scheduler."""
    if update in ("merged", "mini_batches"):
        return {"update_schedule": update}
    from presets import preset

    paper = {name: preset("paper_math")[name] for name in PAPER_UPDATE}
    sizes = dict(
        mini_batch_prompts=1,
        max_tokens_per_micro_batch=TINY_TOKEN_BOUND,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.5},
    )
    if update == "paper":
        return {**paper, **sizes}
    if update == "clip_merged":  # one step's norms are ~0.1 to 0.2 per adapter: some are clipped, some not
        return {**paper, **sizes, "update_schedule": "merged", "max_grad_norm": 0.1}
    raise ValueError(f"No update named {update!r}.")


def update_gap(after: dict, reference: dict, before: dict) -> float:
    """How far one adapter's update is from a reference update of the same weights: the norm of ``after -
    reference`` over the norm of ``reference - before``, over every tensor of the adapter (name -> tensor). Float
    rounding that Adam enlarges where a gradient is near zero moves a few weights by up to ~2% of an optimizer step,
    which this hardly sees; an adapter stepped when it should not be, or clipped by another norm, moves them all."""
    off = sum(float((after[name] - weights).pow(2).sum()) for name, weights in reference.items())
    update = sum(float((weights - before[name]).pow(2).sum()) for name, weights in reference.items())
    return (off / update) ** 0.5


def tiny_config(output_dir, **overrides) -> MultiAgentGRPOConfig:
    """``CPU_SETTINGS`` with ``overrides`` on top."""
    return MultiAgentGRPOConfig(output_dir=str(output_dir), **{**CPU_SETTINGS, **overrides})


def tiny_lora() -> LoraConfig:
    """A new config per model: PEFT writes the target modules it resolves into the config it is given."""
    return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)


def random_answers(requests, rng) -> list[str]:
    """A boxed number from 2 to 5 for every request: some right, some wrong, so groups have a learning signal."""
    return [f"\\boxed{{{rng.randint(2, 5)}}}" for _ in requests]


def half_right_answers(requests, rng) -> list[str]:
    """Every call answers "What is i + 2?" (the problem found anywhere in its messages) right half of the time, so
    every group of episodes is likely to hold both outcomes; a judge's answer falls to its parser's fallbacks."""
    outputs = []
    for request in requests:
        messages = request.messages
        text = messages if isinstance(messages, str) else " ".join(m["content"] for m in messages)
        found = re.search(r"What is (\d+) \+ 2", text)
        i = int(found.group(1)) if found else 0
        outputs.append(f"\\boxed{{{i + 2 if rng.random() < 0.5 else i + 3}}}" if found else "\\boxed{1}")
    return outputs


def tiny_trainer(
    model_dir,
    output_dir,
    workflow=None,
    *,
    dataset=None,
    eval_dataset=None,
    respond=None,
    respond_seed: int = 0,
    reward_funcs=boxed_answer_reward,
    reward_processing_classes=None,
    answer_checker=None,
    backend=None,
    role_reward_funcs=None,
    **config,
) -> MultiAgentGRPOTrainer:
    """A trainer of ``workflow`` (``Voting()`` by default) on ``dataset`` (``addition_dataset()``), its adapters as
    ``tiny_lora()``, its arguments ``tiny_config(output_dir, **config)``.

    With ``respond`` the rollouts are scripted: ``ScriptedBackend(tokenizer, respond, respond_seed)``; without, the
    tiny model generates them; ``backend`` is an engine to generate with instead (one vLLM engine shared by tests).
    """
    tokenizer = None
    if respond is not None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        backend = ScriptedBackend(tokenizer, respond, seed=respond_seed)
    return MultiAgentGRPOTrainer(
        model=model_dir,
        workflow=Voting() if workflow is None else workflow,
        reward_funcs=reward_funcs,
        args=tiny_config(output_dir, **config),
        train_dataset=addition_dataset() if dataset is None else dataset,
        eval_dataset=eval_dataset,
        peft_config=tiny_lora(),
        processing_class=tokenizer,
        reward_processing_classes=reward_processing_classes,
        rollout_backend=backend,
        answer_checker=answer_checker,
        role_reward_funcs=role_reward_funcs,
    )


def train_recording(trainer) -> tuple[list, list]:
    """Train ``trainer`` and return what it scored: every generation batch ``_generate_and_score`` returned (what the
    loss read) and every episode the engine ran, in order."""
    batches, episodes = [], []
    score, run = trainer._generate_and_score, trainer.engine.run

    def recorded_score(inputs):
        batches.append(score(inputs))
        return batches[-1]

    def recorded_run(prompts):
        ran = run(prompts)
        episodes.extend(ran)
        return ran

    trainer._generate_and_score = recorded_score
    trainer.engine.run = recorded_run
    trainer.train()
    return batches, episodes
