"""`--vllm_server_base_urls` on the command line, in every form a user writes it: a comma-separated list, a JSON list,
a JSON mapping of base model -> URLs, or `base=url,...`; read by a recipe's own parser (TrlParser over
`MultiAgentGRPOConfig`), by `trl-multiagent train`, and as `trl-multiagent vllm-serve --dry-run` prints it."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys

import pytest
from harness import ROOT, offline_env
from trl import ModelConfig, ScriptArguments, TrlParser

from trl_multiagent import MultiAgentGRPOConfig
from trl_multiagent.cli import main

SERVER = ["--rollout_backend", "vllm", "--vllm_mode", "server", "--use_cpu", "true", "--bf16", "false"]


def parsed(tmp_path, *flags: str):
    """The recipe's parser, as recipes/eval_opt_math.py builds it."""
    parser = TrlParser((ScriptArguments, MultiAgentGRPOConfig, ModelConfig))
    _, training_args, _ = parser.parse_args_and_config(["--output_dir", str(tmp_path), *SERVER, *flags])
    return training_args.vllm_server_base_urls


@pytest.mark.parametrize(
    "given, urls",
    [
        ("http://node0:8000,http://node1:8000", ["http://node0:8000", "http://node1:8000"]),
        ("http://node0:8000, http://node1:8000", ["http://node0:8000", "http://node1:8000"]),
        ('["http://node0:8000", "http://node1:8000"]', ["http://node0:8000", "http://node1:8000"]),
        (
            '{"Qwen/Qwen3-1.7B": ["http://node0:8000", "http://node1:8000"], "Qwen/Qwen3-0.6B": "http://node0:8001"}',
            {"Qwen/Qwen3-1.7B": ["http://node0:8000", "http://node1:8000"], "Qwen/Qwen3-0.6B": ["http://node0:8001"]},
        ),
        (
            "Qwen/Qwen3-1.7B=http://node0:8000,Qwen/Qwen3-1.7B=http://node1:8000,Qwen/Qwen3-0.6B=http://node0:8001",
            {"Qwen/Qwen3-1.7B": ["http://node0:8000", "http://node1:8000"], "Qwen/Qwen3-0.6B": ["http://node0:8001"]},
        ),
    ],
)
def test_every_form_parses_through_the_recipe_parser(tmp_path, given, urls):
    assert parsed(tmp_path, "--vllm_server_base_urls", given) == urls
    assert parsed(tmp_path, f"--vllm_server_base_urls={given}") == urls


def test_a_yaml_config_still_gives_lists_and_mappings(tmp_path):
    config = tmp_path / "servers.yaml"
    config.write_text("vllm_server_base_urls:\n  toy: http://node0:8000\n  toy-judge: [http://node0:8001]\n")
    assert parsed(tmp_path, "--config", str(config)) == {
        "toy": ["http://node0:8000"],
        "toy-judge": ["http://node0:8001"],
    }
    config.write_text("vllm_server_base_urls: [http://node0:8000, http://node1:8000]\n")
    assert parsed(tmp_path, "--config", str(config)) == ["http://node0:8000", "http://node1:8000"]


@pytest.mark.parametrize(
    "given, message",
    [
        ("toy=http://node0:8000,http://node1:8000", "mixes URLs and base=URL pairs at 'http://node1:8000'"),
        ('{"toy": ["http://node0:8000"]', "is not valid JSON"),
        ("node0:8000,node1:8000", "must list http\\(s\\) URLs"),
    ],
)
def test_a_malformed_value_says_how_to_write_it(tmp_path, given, message):
    with pytest.raises(ValueError, match=message):
        parsed(tmp_path, "--vllm_server_base_urls", given)


def test_the_mapping_vllm_serve_prints_parses_as_printed(tmp_path, capsys):
    serve = ["vllm-serve", "--config", "toy_two_models", "--workflow", "eval_opt", "--host", "127.0.0.1"]
    assert main([*serve, "--port", "8100", "--dry-run"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    trainer_flags = shlex.split(printed.removeprefix("# the trainer: "))
    assert parsed(tmp_path, *trainer_flags) == {
        "toy": ["http://127.0.0.1:8100"],
        "toy-judge": ["http://127.0.0.1:8101"],
    }


@pytest.mark.slow
def test_trl_multiagent_train_takes_the_urls_and_names_every_server_it_cannot_reach(tmp_path):
    ports = []
    for _ in range(2):  # ports nothing listens on
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    urls = ",".join(f"toy=http://127.0.0.1:{port}" for port in ports)
    command = [sys.executable, "-m", "trl_multiagent.cli", "train", "eval_opt", "--config", "toy", "--max_steps", "1"]
    command += ["--output_dir", str(tmp_path / "run"), "--rollout_backend", "vllm", "--vllm_mode", "server"]
    command += ["--vllm_server_base_urls", urls, "--vllm_server_timeout", "1"]
    done = subprocess.run(command, cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "invalid" not in done.stderr
    for port in ports:  # parsed into the toy base's two servers, both asked for their health
        said = f"No vLLM server answered at http://127.0.0.1:{port}/health within 1 s"
        assert said in done.stderr, done.stderr[-3000:]
