"""The compact console: one line per step with success and each role's length, instead of TRL's metrics dict."""

from __future__ import annotations

from peft import LoraConfig
from scripted import addition_dataset, boxed_answer_reward
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.monitoring.console import RoleConsoleCallback, compact_console, console_line
from trl_multiagent.tasks.math import math_answer_checker


def test_console_line_shows_success_and_each_role():
    logs = {
        "loss": 0.1,
        "workflow/success": 0.53125,
        "role/generator/completion_length": 41.25,
        "role/evaluator/completion_length": 30.0,
        "workflow/regraded/generator": 0.5,
        "workflow/verdict_accuracy": 0.78125,
        "alarm/evaluator/judge_code": 1.0,
    }
    assert console_line(logs, 12, 100) == (
        "step 12/100 | success 0.531 | generator len 41.2 correct 0.50 | evaluator len 30.0 | verdict_accuracy 0.781"
        " | alarm/evaluator/judge_code"
    )
    assert console_line({"train_runtime": 3.0, "train_loss": 0.1}, 100, 100) is None


def test_a_training_run_prints_one_line_per_step_and_still_logs_every_metric(tiny_model_dir, tmp_path, capsys):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_dir,
        workflow=EvalOpt(max_iterations=1),
        reward_funcs=boxed_answer_reward,
        args=MultiAgentGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            max_steps=2,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=False,
            training_summary=False,
        ),
        train_dataset=addition_dataset(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
        answer_checker=math_answer_checker,
    )
    compact_console(trainer.callback_handler.callbacks)
    kinds = [type(callback) for callback in trainer.callback_handler.callbacks]
    assert ProgressCallback not in kinds and PrinterCallback not in kinds and RoleConsoleCallback in kinds
    trainer.train()

    printed = capsys.readouterr()
    lines = [line for line in printed.out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 1/2", "step 2/2"]
    assert all(" | success " in line and " | generator len " in line and " | evaluator len " in line for line in lines)
    assert "'role/generator/completion_length'" not in printed.out + printed.err  # no metrics dict on the console
    assert "role/generator/perplexity" in trainer.state.log_history[0]  # every metric is still logged
