"""A run killed with SIGKILL after its step-4 checkpoint resumes to step 8 with the uninterrupted run's losses."""

from __future__ import annotations

import pytest
from preemption import assert_resume_after_sigkill_matches, launch_worker


@pytest.mark.slow
def test_sigkill_after_checkpoint_then_resume_matches(tiny_model_dir, tmp_path):
    def launch(output_dir: str, *checkpoint: str):
        return launch_worker("kill_worker.py", tiny_model_dir, output_dir, *checkpoint, log=f"{output_dir}.log")

    assert_resume_after_sigkill_matches(launch, tmp_path, adapters=("generator", "aggregator"))
