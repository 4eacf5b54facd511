"""What every folder of the test suite shares: one check for the code sandbox, one way to run a subprocess, and one
way to import a repository script (scripts/, recipes/) that is not a package module.

Tests that start a subprocess (a recipe, torchrun, a `vllm serve`) are marked ``slow``: the README's test command
leaves them out and .ci/run runs them all with ``-m slow``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

import trl_multiagent
from trl_multiagent.tasks.sandbox import sandbox_available

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the repository: recipes/, accelerate_configs/, benchmarks/
CHECKOUT = Path(trl_multiagent.__file__).resolve().parent.parent  # the package the tests import, not an installed one

# The sandbox runs as root or, unprivileged, inside user namespaces (`sandbox_mode`); tests that execute code skip
# only where neither works, and .ci/run runs them both ways.
needs_sandbox = pytest.mark.skipif(
    not sandbox_available(),
    reason="the code sandbox needs root or unprivileged user namespaces (trl_multiagent.tasks.sandbox.sandbox_mode "
    "says how to enable them)",
)


def offline_env(env: dict[str, str] | None = None, unset: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment for a child: no Hub or dataset downloads, wandb offline, one thread, and the test
    helpers and this checkout importable. ``env`` adds to it (a ``PYTHONPATH`` there goes first); ``unset`` drops."""
    env = dict(env or {})
    path = [env.pop("PYTHONPATH", ""), str(TESTS), str(CHECKOUT), os.environ.get("PYTHONPATH", "")]
    child = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        **env,
    }
    for name in unset:
        child.pop(name, None)
    return child


def run_offline(
    command: list[str],
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """Run ``command`` in ``offline_env(env)`` and return it once it exited 0; otherwise fail the test with the
    command and the end of its output. ``timeout`` only stops a hung child."""
    result = subprocess.run(command, cwd=cwd, env=offline_env(env), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"`{shlex.join(map(str, command))}` exited {result.returncode}\n"
        f"--- stdout (end)\n{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-5000:]}"
    )
    return result


def launch_offline(
    command: list[str],
    *,
    log: str | Path,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    unset: Iterable[str] = (),
) -> subprocess.Popen:
    """Start ``command`` in ``offline_env(env, unset)`` in the background, its output into the file ``log`` (a full
    pipe would block it); ``tail(log)`` reads the end back for a failure message."""
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=cwd, env=offline_env(env, unset), stdout=out, stderr=subprocess.STDOUT)


def tail(log: str | Path, chars: int = 3000) -> str:
    return Path(log).read_text()[-chars:]


def load_script(relative: str):
    """The module of the repository's script at ``relative`` (e.g. ``"scripts/toy_residuals.py"``), imported from
    its file: the scripts are run, not installed."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
