"""`--validate`: a recipe (or `trl-multiagent train`) makes every check the trainer would make of its settings, under
the launch the command asks for, on this CPU machine, without the model, the Hub or a GPU; and `--print_config` is the
flag's spelling, `--print-config` an alias."""

from __future__ import annotations

import os
import runpy
import sys

import pytest
from harness import ROOT, run_offline
from peft import LoraConfig
from presets import ON_CPU
from trl import ModelConfig, ScriptArguments

import trl_multiagent.cli.shipped
from trl_multiagent import EvalOpt, MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.cli.commands import train_run
from trl_multiagent.cli.recipe_parser import RecipeParser
from trl_multiagent.cli.validation import LAUNCH_VARIABLE, one_process_launch, planned_launch_of_this_process
from trl_multiagent.workflows.options import WorkflowOptions

# vLLM rollouts of the next batch during this step: a setting whose check depends on the number of processes.
AHEAD = ["--rollout_backend", "vllm", "--vllm_mode", "server", "--vllm_server_base_url", "http://127.0.0.1:8000"]
AHEAD += ["--rollout_ahead", "1", "--update_schedule", "merged"]
TOY_AHEAD = ["--config", "toy", *AHEAD]
TRAINING = (ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions)  # a training recipe's, less its own


def validate(recipe: str, *argv: str, env: dict[str, str] | None = None, monkeypatch, capsys) -> tuple[int, str, str]:
    """Run ``recipes/<recipe>.py argv --validate`` here: its exit code, stdout and stderr."""
    env = {LAUNCH_VARIABLE: "", **(env or {})}  # the launch the recipe plans for itself is undone after the test
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", [f"recipes/{recipe}.py", *argv, "--validate"])
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "recipes" / f"{recipe}.py"), run_name="__main__")
    printed = capsys.readouterr()
    return stop.value.code, printed.out, printed.err


def launched(accelerate_config: str, recipe: str, *argv: str) -> dict[str, str]:
    """The environment `accelerate launch --config_file accelerate_configs/<config>.yaml` gives the recipe."""
    _, env = one_process_launch(
        f"recipes/{recipe}.py", argv, ["--config_file", f"accelerate_configs/{accelerate_config}.yaml"]
    )
    return env


def test_the_paper_preset_validates_on_a_machine_without_a_gpu(monkeypatch, capsys):
    """Bare, a recipe runs the paper preset in bf16: on CPU it stops naming the toy preset; `--validate` checks it."""
    monkeypatch.setattr(trl_multiagent.cli.shipped, "bf16_device_available", lambda: False)
    code, out, err = validate("voting_math", "--output_dir", "runs/voting", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert "validate: every check the trainer makes of these settings passed" in out
    assert "mixed precision bf16, GPU" in out and "Qwen/Qwen3-1.7B (not here" in out
    assert "open-r1/DAPO-Math-17k-Processed (the Hub: not downloaded" in out  # no download: a stand-in row
    assert "Voting(" in out and "settings  library defaults + paper_math.yaml + command line" in out


def test_a_launch_dependent_check_sees_the_launchs_processes(monkeypatch, capsys):
    """rollout_ahead needs one training process: accepted as one process, refused under the 8-GPU launch, whose
    processes the settings count with (8 prompts per process there: the paper's 64 per step)."""
    code, out, _ = validate("eval_opt_math", "--config", "toy", *AHEAD, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "1 process(es) on 1 machine(s)" in out and "the next batch's during this step" in out
    env = launched("multi_gpu", "eval_opt_math")
    code, _, err = validate(
        "eval_opt_math", "--config", "toy", *AHEAD, env=env, monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 1
    assert "validate: the trainer would refuse these settings" in err and "one training process (got 8)" in err


def test_a_deepspeed_launch_is_validated_as_deepspeed(monkeypatch, capsys):
    """The paper preset's own update under ZeRO-3 (mini-batches per adapter, each clipped on its own, token-bounded
    forwards, the scheduler per update call), as docs/quickstart.md launches it: accepted."""
    monkeypatch.setattr(trl_multiagent.cli.shipped, "bf16_device_available", lambda: False)
    env = launched("deepspeed_zero3", "eval_opt_math")
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    argv = ("--output_dir", "runs/eval_opt", "--policy_sharing", "isolated")
    code, out, err = validate("eval_opt_math", *argv, env=env, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert "mini_batches" in out and "settings  library defaults + paper_math.yaml + command line" in out
    assert "DeepSpeed ZeRO-3, 8 process(es) on 1 machine(s), mixed precision bf16" in out
    assert "as accelerate launch (DeepSpeed) would start it" in out


def started_by(accelerate_config: str, recipe: str, *, rank: int = 0) -> dict[str, str]:
    """The environment of process ``rank`` that `accelerate launch --config_file accelerate_configs/<config>.yaml
    recipes/<recipe>.py` itself starts on this machine: accelerate's variables, and torchrun's for the process."""
    env = {name: value for name, value in launched(accelerate_config, recipe).items() if name != LAUNCH_VARIABLE}
    processes = planned_launch_of_this_process_for(launched(accelerate_config, recipe)).processes
    torchrun = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": processes, "LOCAL_WORLD_SIZE": processes}
    return {**env, **{name: str(value) for name, value in torchrun.items()}}


def planned_launch_of_this_process_for(env: dict[str, str]):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LAUNCH_VARIABLE, env[LAUNCH_VARIABLE])
        return planned_launch_of_this_process()


@pytest.mark.parametrize(
    "accelerate_config, engine",
    [("multi_gpu", "DDP"), ("deepspeed_zero2", "DeepSpeed ZeRO-2"), ("deepspeed_zero3", "DeepSpeed ZeRO-3")],
)
def test_under_accelerate_launch_the_paper_preset_is_checked_with_the_launchs_processes(
    accelerate_config, engine, monkeypatch, capsys
):
    """docs/quickstart.md's `accelerate launch --config_file accelerate_configs/multi_gpu.yaml recipes/voting_math.py
    --output_dir runs/voting --policy_sharing shared --validate` on a machine without a GPU: each of the 8 processes
    accelerate starts checks the 8-process launch (64 prompts a step: 8 per process), joins no process group (it
    would wait for the others), and the first alone prints."""
    monkeypatch.setattr(trl_multiagent.cli.shipped, "bf16_device_available", lambda: False)
    argv = ("--output_dir", "runs/voting", "--policy_sharing", "shared")
    env = started_by(accelerate_config, "voting_math")
    assert env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "0"
    code, out, err = validate("voting_math", *argv, env=env, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert f"{engine}, 8 process(es) on 1 machine(s), mixed precision bf16" in out
    assert "512 episodes (8 per prompt) over 8 process(es)" in out
    assert "started it, each process checked alone" in out
    assert "WORLD_SIZE" not in os.environ and "LOCAL_RANK" not in os.environ  # no process group was joined
    code, out, err = validate(
        "voting_math",
        *argv,
        env=started_by(accelerate_config, "voting_math", rank=3),
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert (code, out) == (0, "") and "settings:" not in err  # another process: the same checks, nothing printed


@pytest.mark.slow  # accelerate starts 8 processes on this CPU machine: about 90 s
@pytest.mark.parametrize("accelerate_config, engine", [("multi_gpu", "DDP"), ("deepspeed_zero2", "DeepSpeed ZeRO-2")])
def test_the_quickstarts_validation_command_checks_the_launch_as_given(accelerate_config, engine):
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    command += [f"accelerate_configs/{accelerate_config}.yaml", "recipes/voting_math.py"]
    command += ["--output_dir", "runs/voting", "--policy_sharing", "shared", "--validate"]
    done = run_offline(command, cwd=ROOT, env={"DS_ACCELERATOR": "cpu"})
    assert done.stdout.count("validate: every check the trainer makes of these settings passed") == 1
    assert f"{engine}, 8 process(es) on 1 machine(s)" in done.stdout
    assert "512 episodes (8 per prompt) over 8 process(es)" in done.stdout


def test_a_launch_dependent_refusal_holds_under_the_launch_itself(monkeypatch, capsys):
    """rollout_ahead needs one training process: refused in each process of the 8 that accelerate starts."""
    env = started_by("multi_gpu", "eval_opt_math")
    code, _, err = validate(
        "eval_opt_math", "--config", "toy", *AHEAD, env=env, monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 1 and "one training process (got 8)" in err


def test_the_trainer_refuses_what_validation_refuses_before_loading_the_model(monkeypatch, capsys):
    """One check, two callers: the same refusal, and the trainer makes it before it reads the model's folder."""
    argv = [*AHEAD, "--vllm_importance_sampling_correction", "false"]
    code, _, err = validate("eval_opt_math", "--config", "toy", *argv, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1
    refusal = err.split("validate: the trainer would refuse these settings when it is built: ")[1].strip()
    args = MultiAgentGRPOConfig(
        output_dir="unused",
        use_cpu=True,
        bf16=False,
        rollout_backend="vllm",
        vllm_mode="server",
        vllm_server_base_url="http://127.0.0.1:8000",
        rollout_ahead=1,
        update_schedule="merged",
        vllm_importance_sampling_correction=False,
    )
    with pytest.raises(ValueError) as refused:
        MultiAgentGRPOTrainer(
            model="no/such/model/folder",
            workflow=EvalOpt(),
            reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
            args=args,
            train_dataset=[{"prompt": [{"role": "user", "content": "1 + 1?"}]}],
            peft_config=LoraConfig(r=4),
        )
    assert str(refused.value) == refusal


def test_trl_multiagent_train_validates_in_one_process_with_the_launchs_environment():
    command, env = train_run(["eval_opt", "--config", "toy", "--accelerate_config", "deepspeed_zero2", "--validate"])
    assert command[:2] == [sys.executable, str(ROOT / "recipes" / "eval_opt_math.py")] and command[-1] == "--validate"
    assert "accelerate.commands.launch" not in command  # no processes started: one stands for them
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LAUNCH_VARIABLE, env[LAUNCH_VARIABLE])
        planned = planned_launch_of_this_process()
    assert (planned.processes, planned.machines) == (8, 1)
    command, env = train_run(["voting", "--accelerate_config", "multi_node", "--print_config"])
    assert "accelerate.commands.launch" not in command and '"processes": 16, "machines": 2' in env[LAUNCH_VARIABLE]
    command, env = train_run(["voting", "--accelerate_config", "multi_node", "--max_steps", "3"])
    assert "accelerate.commands.launch" in command and env == {}  # training: accelerate starts the processes


@pytest.mark.parametrize("flag", ["--print_config", "--print-config"])
def test_print_config_is_spelled_with_an_underscore_and_the_hyphen_is_an_alias(flag, capsys):
    parser = RecipeParser(TRAINING)
    with pytest.raises(SystemExit) as stop:
        parser.parse_args_and_config(["--config", "paper_math", *ON_CPU, "--output_dir", "x", flag])
    assert stop.value.code == 0
    assert "temperature: 0.7  # paper_math.yaml" in capsys.readouterr().out.splitlines()
    assert "--print_config (alias --print-config)" in parser.format_help().replace("\n", " ")


def test_print_config_reads_a_gpu_preset_on_this_machine(capsys):
    """The paper preset's bf16 needs a GPU to train, not to be printed."""
    with pytest.raises(SystemExit):
        RecipeParser(TRAINING).parse_args_and_config(
            ["--config", "recipes/configs/paper_math.yaml", "--output_dir", "x", "--print_config"]
        )
    assert "bf16: true  # paper_math.yaml" in capsys.readouterr().out.splitlines()


def test_a_script_without_validation_refuses_the_flag_rather_than_run(capsys):
    with pytest.raises(SystemExit) as stop:
        RecipeParser((ScriptArguments,)).parse_args_and_config(["--validate"])
    assert stop.value.code == 2 and "--validate checks a training run's settings" in capsys.readouterr().err
