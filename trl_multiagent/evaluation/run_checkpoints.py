"""A run folder's checkpoints in step order: what an evaluation walks, and what a judge's newest checkpoint is."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..checkpoints import CONFIG_NAME

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``checkpoint-N`` in ``run_dir`` by step; the folder itself if it has none."""
    run_dir = Path(run_dir)
    found = [
        (int(match.group(1)), path)
        for path in run_dir.iterdir()
        if (match := _CHECKPOINT.match(path.name)) and (path / CONFIG_NAME).is_file()
    ]
    if found:
        return sorted(found)
    if (run_dir / CONFIG_NAME).is_file():
        match = _CHECKPOINT.match(run_dir.name)
        state = run_dir / "trainer_state.json"
        step = int(match.group(1)) if match else json.loads(state.read_text())["global_step"] if state.is_file() else 0
        return [(step, run_dir)]
    raise FileNotFoundError(f"{run_dir} holds no checkpoint-N folder and no {CONFIG_NAME}; pass a run's output_dir.")
