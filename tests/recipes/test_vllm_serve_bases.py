"""`trl-multiagent vllm-serve` with roles on several base models: one `vllm serve` per base, each with the slots of
its own adapters, and the `vllm_server_base_urls` mapping the trainer reads to reach them."""

from __future__ import annotations

import json
import shlex

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.cli import serve_process
from trl_multiagent.cli.commands import main, vllm_serve_command
from trl_multiagent.common.model_names import resolve_model_name
from trl_multiagent.rollout.backends.from_config import server_urls

TWO_BASES = ["--config", "toy_two_models", "--workflow", "eval_opt", "--host", "127.0.0.1", "--port", "8100"]


def served(line: str) -> dict:
    argv = shlex.split(line)[1:]  # after the environment assignment
    return {"model": argv[2], "port": argv[argv.index("--port") + 1], "slots": argv[argv.index("--max-loras") + 1]}


def test_dry_run_prints_one_server_per_base_and_the_urls_the_trainer_reads(capsys, tmp_path):
    assert main(["vllm-serve", *TWO_BASES, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    commands = [line for line in lines if not line.startswith("#")]
    assert [served(line) for line in commands] == [
        {"model": resolve_model_name("toy"), "port": "8100", "slots": "2"},  # the generator's adapter (+1 slot)
        {"model": resolve_model_name("toy-judge"), "port": "8101", "slots": "2"},  # the evaluator's
    ]
    assert "# toy-judge (adapters evaluator)" in lines
    trainer = shlex.split(lines[-1].removeprefix("# the trainer: "))
    urls = trainer[trainer.index("--vllm_server_base_urls") + 1]
    assert json.loads(urls) == {"toy": ["http://127.0.0.1:8100"], "toy-judge": ["http://127.0.0.1:8101"]}
    args = MultiAgentGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        rollout_backend="vllm",
        vllm_mode="server",
        vllm_server_base_urls=urls,
        role_models={"evaluator": "toy-judge"},
        report_to="none",
    )
    assert server_urls(args, "toy") == ["http://127.0.0.1:8100"]
    assert server_urls(args, "toy-judge") == ["http://127.0.0.1:8101"]


def test_shared_policy_gives_each_base_its_own_shared_adapter():
    commands, _, _ = vllm_serve_command(
        [
            *TWO_BASES,
            "--workflow",
            "voting",
            "--policy_sharing",
            "shared",
            "--role_models",
            '{"aggregator": "toy-judge"}',
        ]
    )
    assert [(c.base, c.adapters) for c in commands] == [("toy", ["shared"]), ("toy-judge", ["shared-toy-judge"])]


def test_starting_needs_the_base_to_serve_here(monkeypatch, capsys):
    assert main(["vllm-serve", *TWO_BASES]) == 2
    err = capsys.readouterr().err
    assert "2 base models (toy, toy-judge)" in err and "--base NAME" in err and "--dry-run" in err
    assert main(["vllm-serve", *TWO_BASES, "--base", "Qwen/Qwen3-0.6B"]) == 2
    assert "its bases are ['toy', 'toy-judge']" in capsys.readouterr().err

    started = {}

    def run_server(argv, env):
        started.update(argv=argv, allow=env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
        return 3

    monkeypatch.setattr(serve_process, "run_server", run_server)
    assert main(["vllm-serve", *TWO_BASES, "--base", "toy-judge"]) == 3  # the server's exit code
    argv = started["argv"]
    assert resolve_model_name("toy-judge") in argv and argv[argv.index("--port") + 1] == "8101"
    assert started["allow"] == "True"
