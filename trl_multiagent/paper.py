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
    prompts_per_step=64,  # over all processes, as the reference's train_batch_size: the same step on 1, 2 or 8 GPUs
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
    rollout_max_batch_tokens=350_000,  # PAPER_ROLLOUT_MEMORY below: fits a 141 GB H200 with Qwen3-4B
    loss_type="grpo",
    delta=3.0,  # caps the ratio at 3: with epsilon_high < 2, verl's dual clip (c = 3) on negative advantages
    beta=0.0,
    max_steps=500,
    save_steps=5,
    logging_steps=1,
    bf16=True,
)
# PAPER_ROLLOUT_MEMORY: why rollout_max_batch_tokens=350_000 fits a 141 GB H200 (transformers backend, bf16, on paper).
# KV cache per token = 2 (K, V) x layers x KV heads x head_dim x 2 bytes: Qwen3-1.7B 2x28x8x128x2 = 114,688 B;
# Qwen3-4B 2x36x8x128x2 = 147,456 B. A generate call holds at most 350,000 tokens of it: 40.1 GB (1.7B), 51.6 GB (4B).
# Prefill runs a call's prompts in one forward; taking every one of those tokens as a prompt token (an upper bound),
# one layer's bf16 activations (residual, q/k/v with their norm and rope copies, attention out, gate/up/act/product,
# a LoRA output; SDPA's memory-efficient kernel, no prompt^2 scores) add ~94 KB (1.7B) / ~145 KB (4B) per token:
# 33.0 / 50.9 GB. Decoding keeps fp32 logits of one token per row: rows x 151,936 x 4 B, under 1.2 GB even at 512
# new tokens a row. Always resident: bf16 weights 3.4 / 8.0 GB (1.72B / 4.02B parameters); LoRA r=64 on all linear
# layers, 69.7M / 132.1M parameters per adapter, fp32 with gradient and AdamW's two moments (16 B each), three adapters
# (Orch-Workers, isolated) 3.3 / 6.3 GB. Rollout peak: 1.7B 3.4 + 3.3 + 40.1 + 33.0 + 1.2 = 81 GB; 4B 8.0 + 6.3 + 51.6
# + 50.9 + 1.2 = 118 GB, leaving 23 GB of the 141 for the CUDA context and allocator fragmentation. Training runs
# after the rollout, in the memory it freed: one forward of max_tokens_per_micro_batch=51,200 tokens has logits of
# 51,200 x 151,936 x 2 B = 15.6 GB, counted four times (logits, temperature-scaled copy, log-softmax kept for backward,
# its gradient) 62.2 GB, plus checkpointed layer inputs (4B: 36 x 51,200 x 2,560 x 2 B = 9.4 GB) and one layer
# recomputed with gradients (~15 GB): 4B 8.0 + 6.3 + 62.2 + 9.4 + 15 = 101 GB. Without the bound one Voting tick
# (1,536 voter calls of up to 5.4k tokens) would ask 1,536 x 5.4k x 147,456 B = 1.2 TB of KV cache on the 4B.
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
