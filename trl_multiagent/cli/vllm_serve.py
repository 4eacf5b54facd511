"""The `vllm serve` commands a run with `vllm_mode="server"` needs: one per base model its roles sit on.

Each server serves one base with one LoRA slot per adapter the trainer syncs to it (plus one), the run's LoRA rank,
runtime adapter loading and the sampled-token log-probs the trainer compares. With roles on several base models
(`role_models`), the main base's server takes `--port` and each other base the next port, in the order the workflow's
roles first name them; `trainer_urls` is the `vllm_server_base_urls` mapping the run then needs.
"""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .shipped import read_preset

# runtime adapter loading: the trainer loads each synced adapter into the running server
SERVER_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServeCommand:
    """One server: the base model as the run names it, its adapters, the command, and the URL the trainer calls."""

    base: str
    adapters: list[str]
    argv: list[str]
    url: str


def parser(built_in: Sequence[str]) -> argparse.ArgumentParser:
    serve = argparse.ArgumentParser(
        prog="trl-multiagent vllm-serve",
        description="The `vllm serve` command(s), and their environment, serving every role adapter the trainer "
        "syncs: one server per base model the roles sit on.",
    )
    serve.add_argument("--config", help="A training preset (path or shipped name): its model(s), LoRA rank, sharing.")
    serve.add_argument("--model", help="Base model (default: the preset's model_name_or_path).")
    serve.add_argument(
        "--role_models",
        help="JSON role -> base model for roles on other bases (default: the preset's), e.g. "
        '\'{"evaluator": "Qwen/Qwen3-0.6B"}\'.',
    )
    serve.add_argument(
        "--workflow", default="eval_opt", help=f"Built-in ({', '.join(built_in)}) or package.module:Class."
    )
    serve.add_argument("--workflow_kwargs", default="{}", help="JSON keyword arguments of the workflow class.")
    serve.add_argument("--policy_sharing", choices=("shared", "isolated"))
    serve.add_argument("--lora_r", type=int)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8000, help="The main base's port; each other base takes the next.")
    serve.add_argument(
        "--base", help="With several bases: the one whose server to start here (each needs its own GPUs or machine)."
    )
    serve.add_argument("--dry-run", action="store_true", help="Print the command(s) instead of starting a server.")
    return serve


def serve_commands(known: argparse.Namespace, extra: Sequence[str], workflow) -> list[ServeCommand]:
    """One `vllm serve` command per base model of ``workflow``'s roles, the main base first; ``extra``: vLLM flags."""
    from ..adapters.bases import adapters_on_bases, role_bases
    from ..adapters.routing import resolve_role_adapters
    from ..common.model_names import resolve_model_name
    from ..rollout.backends.vllm_backend import max_lora_rank

    preset = read_preset(known.config or "paper_math")  # the recipes' own default preset

    def setting(name: str, default: Any) -> Any:  # the flag, else the preset's, else `default`
        value = getattr(known, name, None)
        return value if value is not None else preset.get(name, default)

    role_models = json.loads(known.role_models) if known.role_models else preset.get("role_models")
    if role_models is not None and not isinstance(role_models, dict):
        raise ValueError(f"--role_models must be a JSON object of role -> base model, got {known.role_models!r}.")
    main = known.model or preset.get("model_name_or_path")
    if main is None:
        raise ValueError(f"{known.config} sets no model_name_or_path; pass --model.")
    explicit = preset.get("role_to_adapter")
    role_adapters = resolve_role_adapters(workflow.roles, setting("policy_sharing", "isolated"), explicit)
    bases = role_bases(list(role_adapters), role_models, main)
    _, adapter_base = adapters_on_bases(role_adapters, bases, main, explicit=bool(explicit))
    rank = max_lora_rank(setting("lora_r", 16))
    host = socket.gethostname() if known.host in ("0.0.0.0", "::") else known.host
    commands = []
    for base in dict.fromkeys([main, *adapter_base.values()]):
        adapters = [adapter for adapter, on in adapter_base.items() if on == base]
        if not adapters:  # the main base serves no role (every role sits elsewhere)
            continue
        port = known.port + len(commands)
        argv = ["vllm", "serve", resolve_model_name(base), "--host", known.host, "--port", str(port), "--enable-lora"]
        # one slot more than adapters: on vLLM's CPU build a request without adapter takes the last slot's otherwise
        argv += ["--max-loras", str(len(adapters) + 1), "--max-lora-rank", str(rank)]
        argv += ["--logprobs-mode", "processed_logprobs", *extra]  # sampled-token log-probs, as the trainer compares
        commands.append(ServeCommand(base=base, adapters=adapters, argv=argv, url=f"http://{host}:{port}"))
    return commands


def trainer_urls(commands: Sequence[ServeCommand]) -> str:
    """The `--vllm_server_base_urls` value (JSON) mapping each base to its server."""
    return json.dumps({command.base: [command.url] for command in commands})


def pick(commands: Sequence[ServeCommand], base: str | None) -> ServeCommand:
    """The server to start here: the only one, or the one ``--base`` names."""
    from ..adapters.bases import same_model

    if base is not None:
        found = [command for command in commands if same_model(command.base, base)]
        if not found:
            raise ValueError(f"--base {base!r} is not a base of this run; its bases are {[c.base for c in commands]}.")
        return found[0]
    if len(commands) > 1:
        raise ValueError(
            f"The roles sit on {len(commands)} base models ({', '.join(c.base for c in commands)}), each served by "
            "its own `vllm serve`: start each with --base NAME (on its own GPUs or machine), or print all the "
            "commands with --dry-run."
        )
    return commands[0]
