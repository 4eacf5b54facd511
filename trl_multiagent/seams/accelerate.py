"""accelerate below its public surface (the names ``accelerate`` and ``accelerate.utils`` export, as its reference
documents them). Checked against accelerate 1.10.1 (setup.cfg's floor) and 1.16."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from unittest import mock


@contextmanager
def gradients_unsynced(accelerator) -> Iterator[None]:
    """While it lasts, ``accelerator`` treats backward passes as inside an accumulation: its ``backward`` neither steps
    a DeepSpeed engine nor syncs gradients. The Trainer sets ``GradientState.sync_gradients`` for the whole last
    micro-step of an accumulation through the private setter ``GradientState._set_sync_gradients`` (since 0.11; it
    also arms XLA's gradient sync), and so does this, restoring the value after."""
    with _sync_gradients(accelerator, False):
        yield


@contextmanager
def gradients_synced(accelerator) -> Iterator[None]:
    """While it lasts, ``accelerator`` treats backward passes as ending an accumulation, as on the Trainer's last
    micro-step: under DeepSpeed its ``backward`` marks the engine's accumulation boundary and steps the engine
    (``DeepSpeedEngineWrapper.backward``). Set and restored as ``gradients_unsynced`` does."""
    with _sync_gradients(accelerator, True):
        yield


@contextmanager
def _sync_gradients(accelerator, value: bool) -> Iterator[None]:
    state = accelerator.gradient_state
    synced = state.sync_gradients
    state._set_sync_gradients(value)
    try:
        yield
    finally:
        state._set_sync_gradients(synced)


# What `accelerate launch` would start, by the launcher it picks: one plain process, torchrun (DDP, FSDP), DeepSpeed.
LAUNCHERS = ("simple_launcher", "multi_gpu_launcher", "deepspeed_launcher")


def planned_launch(argv: Sequence[str]) -> tuple[str, argparse.Namespace, dict[str, str]]:
    """``accelerate launch ARGV`` (its flags, the script and the script's arguments) without starting anything: the
    launcher accelerate picks (one of ``LAUNCHERS``), its arguments once the config file filled them in, and the
    environment variables it sets for every process it starts (``ACCELERATE_USE_DEEPSPEED``, the ZeRO stage, the
    mixed precision...) that this process lacks or has otherwise.

    ``accelerate.commands.launch`` is accelerate's command-line module (not its documented API; the same in 1.10.1 and
    1.16): ``launch_command`` merges the config file into the flags (``_validate_launch_command``) and calls one of the
    module's launchers, each of which builds its environment with ``accelerate.utils.prepare_*`` and starts the
    processes. Here the launchers are swapped, for the call, for ones that only record which was picked; the
    environment comes from the same ``prepare_*`` function that launcher calls. Those functions also ask whether the
    rendezvous port is free here (``is_port_in_use``, as imported into ``accelerate.utils.launch``, 1.10.1 to 1.16),
    which concerns the machine that starts the processes when it starts them: it is answered "free"."""
    from accelerate.commands import launch
    from accelerate.utils import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = launch.launch_command_parser().parse_args(list(argv))
    picked: dict[str, argparse.Namespace] = {}

    def recorder(name: str):
        def record(launch_args: argparse.Namespace, *_: object) -> None:
            picked[name] = launch_args

        return record

    def unsupported(*_: object) -> None:
        raise ValueError(
            "This `accelerate launch` starts TPU or SageMaker jobs; validation covers launches on this kind of "
            "machine (one process, torchrun for DDP and FSDP, DeepSpeed)."
        )

    launchers = {name: recorder(name) for name in LAUNCHERS}
    others = dict.fromkeys(("tpu_launcher", "tpu_pod_launcher", "sagemaker_launcher"), unsupported)
    with mock.patch.multiple(launch, **launchers, **others):
        launch.launch_command(args)
    ((name, launch_args),) = picked.items()
    with mock.patch("accelerate.utils.launch.is_port_in_use", return_value=False):
        if name == "multi_gpu_launcher":
            env = prepare_multi_gpu_env(launch_args)
        else:
            prepare = prepare_deepspeed_cmd_env if name == "deepspeed_launcher" else prepare_simple_launcher_cmd_env
            _, env = prepare(launch_args)
    return name, launch_args, {key: value for key, value in env.items() if os.environ.get(key) != value}
