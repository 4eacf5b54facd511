"""Training settings of the research behind trl-multiagent (arXiv 2605.24202), as recipe defaults."""

# Reference settings for a real GPU run: Qwen3-1.7B, LoRA r=64 / alpha=32 on all linear layers, 8 workflow episodes
# per problem, 64 problems per step, lr 2e-5 with 15 warm-up steps and cosine decay, clip-high 0.28, temperature 0.7,
# sequence-mean token-mean loss, no KL, 500 steps, a checkpoint every 5.
PAPER_DEFAULTS = dict(
    model_name_or_path="Qwen/Qwen3-1.7B",
    use_peft=True,
    lora_r=64,
    lora_alpha=32,
    lora_target_modules=["all-linear"],
    num_generations=8,
    per_device_train_batch_size=64,
    gradient_accumulation_steps=8,
    learning_rate=2e-5,
    warmup_steps=15,
    lr_scheduler_type="cosine",
    epsilon_high=0.28,
    temperature=0.7,
    loss_type="grpo",
    beta=0.0,
    max_steps=500,
    save_steps=5,
    logging_steps=1,
    bf16=True,
)
MATH_MAX_COMPLETION_LENGTH = 5120
CODE_MAX_COMPLETION_LENGTH = 2048

# What the roles see, per preset: keyword arguments of the built-in workflows (each takes the ones it has).
# "paper": the research's reference workflows (also the workflows' defaults): the paper prompt set, one shared Eval-Opt
# conversation, one worker per strategy, the SA-RL baseline on the generator's request.
# "toy": the requests the shipped toy model was trained on (recipes/configs/toy.yaml): the guarded prompt set, a fresh
# evaluator chat, always n_workers workers, the single agent on the raw dataset prompt.
WORKFLOW_PRESETS = {
    "paper": dict(prompts="paper", history="shared", workers="per_strategy", template="generator"),
    "toy": dict(prompts="guarded", history="fresh", workers="fixed", template="raw"),
}
