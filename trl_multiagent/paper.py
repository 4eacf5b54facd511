"""Training settings of the research behind trl-multiagent (arXiv 2605.24202), as recipe defaults."""

# Reference settings for a real GPU run: Qwen3-1.7B with thinking off, LoRA r=64 / alpha=32 / dropout 0 on all linear
# layers, 8 workflow episodes per problem, 64 problems per step, lr 2e-5 with 15 warm-up steps and cosine decay, weight
# decay 0.01, clip-high 0.28, temperature 0.7, sequence-mean token-mean loss, no KL, 500 steps, a checkpoint every 5;
# the reference's update: sequential mini-batches of 64 problems per adapter, each adapter clipped at 1.0 on its own,
# GRPO groups per problem and trajectory name (every call a sample), at most 51,200 tokens per forward; coherence
# damping (when asked for) over 128 steps. docs/fidelity.md lists every setting against the reference stack.
PAPER_DEFAULTS = dict(
    model_name_or_path="Qwen/Qwen3-1.7B",
    use_peft=True,
    lora_r=64,
    lora_alpha=32,
    lora_target_modules=["all-linear"],
    lora_dropout=0.0,
    num_generations=8,
    per_device_train_batch_size=64,
    gradient_accumulation_steps=8,
    learning_rate=2e-5,
    weight_decay=0.01,
    warmup_steps=15,
    lr_scheduler_type="cosine",
    epsilon_high=0.28,
    temperature=0.7,
    chat_template_kwargs={"enable_thinking": False},
    chat_rendering="reference_qwen",  # the reference's prompts: Qwen's default system prompt, empty think blocks
    update_schedule="mini_batches",
    mini_batch_prompts=64,
    clip_grad_norm_per_adapter=True,
    max_grad_norm=1.0,
    advantage_groups="calls",
    max_tokens_per_micro_batch=51_200,
    role_coherence_window=128,
    # The reference applies no correction for the rollout engine's sampling policy (its rollout log-probs are only
    # logged), and its scheduler steps once per adapter update call (upstream verl's update_actor): docs/fidelity.md.
    vllm_importance_sampling_correction=False,
    lr_scheduler_steps="per_update",
    loss_type="grpo",
    delta=3.0,  # caps the ratio at 3: with epsilon_high < 2, verl's dual clip (c = 3) on negative advantages
    beta=0.0,
    max_steps=500,
    save_steps=5,
    logging_steps=1,
    bf16=True,
)
MATH_MAX_COMPLETION_LENGTH = 5120
CODE_MAX_COMPLETION_LENGTH = 2048
# Checkpoint evaluation gives every call more room than training, so fewer answers are cut off (the reference's
# evaluation lengths; `use_training_lengths` evaluates at the two above instead).
MATH_EVAL_MAX_COMPLETION_LENGTH = 8192
CODE_EVAL_MAX_COMPLETION_LENGTH = 5120

# Checkpoint evaluation as the paper reports it: sampled at the training temperature, thinking off, prompts rendered
# as the reference renders them, held-out split, the evaluation lengths above.
PAPER_EVAL_DEFAULTS = dict(
    temperature=0.7,
    chat_template_kwargs={"enable_thinking": False},
    chat_rendering="reference_qwen",
    use_training_lengths=False,
)

# What the roles see, per preset: keyword arguments of the built-in workflows (each takes the ones it has).
# "paper": the research's reference workflows (also the workflows' defaults): the paper prompt set, one shared Eval-Opt
# conversation, one worker per strategy, the SA-RL baseline on the generator's request, the reference's readers of
# verdicts, selections and strategy lines.
# "toy": the requests the shipped toy model was trained on (recipes/configs/toy.yaml): the guarded prompt set, a fresh
# evaluator chat, always n_workers workers, the single agent on the raw dataset prompt, the robust readers (last box).
WORKFLOW_PRESETS = {
    "paper": dict(
        prompts="paper", history="shared", workers="per_strategy", template="generator", parsing="reference"
    ),
    "toy": dict(prompts="guarded", history="fresh", workers="fixed", template="raw", parsing="robust"),
}
