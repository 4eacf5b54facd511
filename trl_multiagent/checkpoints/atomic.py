"""Checkpoints that survive a failed save: every file of ``checkpoint-<step>`` is written to a folder aside
(``<run>/.checkpoint-in-progress/checkpoint-<step>``), which is renamed to its final name only once all of them are
there. A save that stops midway (a full disk, a job preempted or killed mid-save) leaves the previous checkpoints as
they were, and its partial files aside, where resuming never looks and the next save clears them.

Resuming with ``resume_from_checkpoint=True`` takes the newest complete checkpoint; ``newest_complete_checkpoint``
names the folders it skipped and why (written by a version that saved in place, or copied in part).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

STAGING = ".checkpoint-in-progress"
# What every checkpoint of a run holds once its save finished: the Trainer's state and the run's own description.
REQUIRED_FILES = ("trainer_state.json", "multiagent_config.json")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def staging_root(run_dir: str | os.PathLike) -> str:
    """Where checkpoints are written before they take their final name."""
    return os.path.join(run_dir, STAGING)


def clear_staging(run_dir: str | os.PathLike) -> None:
    """Remove what an interrupted save left aside; an empty staging folder is ready for the next save."""
    root = staging_root(run_dir)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, exist_ok=True)


def publish(run_dir: str | os.PathLike, name: str) -> str:
    """Move the finished ``<staging>/<name>`` to ``<run_dir>/<name>`` with one rename (a checkpoint of the same name
    saved before, e.g. by a run resumed from an earlier step, is replaced) and return the final path."""
    source, target = os.path.join(staging_root(run_dir), name), os.path.join(run_dir, name)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"The save of {name} wrote nothing to {source}; nothing to publish.")
    _sync_tree(source)
    replaced = None
    if os.path.exists(target):
        replaced = os.path.join(staging_root(run_dir), f"{name}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(target, replaced)
    os.rename(source, target)
    _sync_directory(run_dir)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    try:
        os.rmdir(staging_root(run_dir))  # nothing left aside: no trace in the run folder
    except OSError:
        pass
    return target


def missing_files(checkpoint: str | os.PathLike) -> list[str]:
    return [name for name in REQUIRED_FILES if not (Path(checkpoint) / name).is_file()]


def newest_complete_checkpoint(run_dir: str | os.PathLike) -> tuple[str | None, list[str]]:
    """``(the newest complete checkpoint-<step> of run_dir or None, why each newer one was skipped)``."""
    folder = Path(run_dir)
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        match = _CHECKPOINT.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    skipped = []
    for _, path in sorted(found, reverse=True):
        missing = missing_files(path)
        if not missing:
            return str(path), skipped
        skipped.append(f"{path} (no {' and no '.join(missing)}: its save did not finish)")
    return None, skipped


def _sync_tree(folder: str) -> None:
    """Flush every file of ``folder`` to disk, so that the rename never publishes data still in the page cache."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _sync_directory(root)


def _sync_directory(folder: str | os.PathLike) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resume_checkpoint(run_dir: str | os.PathLike) -> str | bool:
    """What ``resume_from_checkpoint=True`` resumes from: the newest complete checkpoint of ``run_dir``, with a
    warning naming each newer one skipped and a save left unfinished aside; ``True`` (the Trainer's own "no
    checkpoint" error follows) when ``run_dir`` holds none at all."""
    newest, skipped = newest_complete_checkpoint(run_dir)
    unfinished = [p.name for p in Path(staging_root(run_dir)).glob("checkpoint-*")]
    if unfinished:
        logger.warning(
            "An interrupted save left %s in %s; resuming ignores it (the next save removes it).",
            ", ".join(sorted(unfinished)),
            staging_root(run_dir),
        )
    if skipped and newest is None:
        raise FileNotFoundError(
            f"No complete checkpoint in {run_dir} to resume from: skipped {'; '.join(skipped)}. Start without "
            "resume_from_checkpoint, or pass the path of a complete checkpoint."
        )
    if skipped:
        logger.warning("Resuming from %s; skipped the newer %s.", newest, "; ".join(skipped))
    return newest if newest is not None else True
