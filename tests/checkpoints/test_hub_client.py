"""push_to_hub through huggingface_hub's own HTTP client, against a Hub on loopback (tests/local_hub.py): the repo is
created, every role adapter, the model cards and the workflow's files arrive byte for byte as the Hub would store them
(weights through Git LFS), the pushed repo rebuilds the trained workflow, and a push after more training commits the
moved weights and the new card while the unchanged LFS files are not uploaded again."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from harness import TESTS, run_offline
from local_hub import LFS_SUFFIXES, LocalHub

from trl_multiagent.checkpoints import load_trained_workflow

ROLES = ("generator", "aggregator")


def push(hub: LocalHub, tiny_model_dir, output_dir: Path, max_steps: int, resume: Path | None = None) -> str:
    command = [sys.executable, str(TESTS / "hub_push_run.py"), str(tiny_model_dir), str(output_dir), str(max_steps)]
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_local"}
    return run_offline(command + ([str(resume)] if resume else []), env=env, timeout=900).stdout


def pushed_files(output_dir: Path) -> dict[str, bytes]:
    """What upload_folder sends of ``output_dir``: every file but checkpoints and `_*` (Trainer.push_to_hub)."""
    files = {}
    for path in output_dir.rglob("*"):
        relative = path.relative_to(output_dir).as_posix()
        if path.is_file() and not relative.startswith(("checkpoint-", "_")):
            files[relative] = path.read_bytes()
    return files


def test_push_and_repush_through_the_real_client(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    with LocalHub() as hub:
        first_answer = push(hub, tiny_model_dir, run, max_steps=2)
        first = dict(hub.repos["me/voting-toy"].files)
        local_first = pushed_files(run)
        lfs_after_first = list(hub.lfs_uploads)
        second_answer = push(hub, tiny_model_dir, run, max_steps=4, resume=run / "checkpoint-2")
        repo = hub.repos["me/voting-toy"]
        local_second = pushed_files(run)

    # Refused only: the second create (the repo exists: the client then reads its info), and the registry of AI agent
    # harnesses that the client looks up for its user agent and does without (this stand-in has none).
    refused = {(method, path, status) for method, path, status in hub.requests if status >= 400}
    create_again = ("POST", "/api/repos/create", 409)
    assert create_again in refused and refused <= {create_again, ("GET", "/api/agent-harnesses", 404)}, hub.requests
    assert f"{hub.endpoint}/me/voting-toy/commit/" in first_answer and "/commit/" in second_answer
    assert [commit.message for commit in repo.commits] == ["End of training", "End of training"]

    # The first commit: the folder as the trainer wrote it, weights through LFS, the rest as regular files.
    assert first == local_first
    for role in ROLES:
        assert f"{role}/adapter_model.safetensors" in repo.commits[0].added_lfs
        assert f"{role}/adapter_config.json" in repo.commits[0].added_regular
    assert set(repo.commits[0].added_lfs) == {p for p in first if p.endswith(LFS_SUFFIXES)}
    card = first["README.md"].decode()
    for fact in (
        "Policy sharing: `isolated`",
        "| `aggregator` | `aggregator/` |",
        'snapshot_download("me/voting-toy")',
        str(tiny_model_dir),
    ):
        assert fact in card, fact
    received = tmp_path / "received"
    for path, data in first.items():
        (received / path).parent.mkdir(parents=True, exist_ok=True)
        (received / path).write_bytes(data)
    assert load_trained_workflow(received).workflow.roles == ROLES

    # The re-push: the tree is the folder after 4 steps; the moved weights were uploaded, nothing unchanged was.
    assert repo.files == local_second
    for role in ROLES:
        path = f"{role}/adapter_model.safetensors"
        assert repo.files[path] != first[path], f"{role}'s adapter did not move between the pushes"
    assert repo.files["README.md"] != first["README.md"]
    uploaded_again = hub.lfs_uploads[len(lfs_after_first) :]
    changed_lfs = {hashlib.sha256(data).hexdigest() for p, data in repo.files.items() if p.endswith(LFS_SUFFIXES)}
    changed_lfs -= {hashlib.sha256(data).hexdigest() for p, data in first.items() if p.endswith(LFS_SUFFIXES)}
    assert sorted(uploaded_again) == sorted(changed_lfs)
