import os
import sys
from pathlib import Path

# The shared helpers (harness, tiny, scripted, presets, reference_rules, preemption, workers/) live here, beside the
# rooms (training/, rollout/, ...): every room imports them by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # a tiny GRPO step is ~10x faster with one thread than with two on these machines


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from trl_multiagent.testing import build_tiny_qwen3

    return build_tiny_qwen3(str(tmp_path_factory.mktemp("tiny-qwen3")))


@pytest.fixture(scope="session")
def tiny_judge_dir(tmp_path_factory) -> str:
    """A second tiny Qwen3 for judging roles: another hidden size and another tokenizer than ``tiny_model_dir``'s."""
    from trl_multiagent.testing import build_tiny_qwen3

    return build_tiny_qwen3(str(tmp_path_factory.mktemp("tiny-judge")), hidden_size=32, seed=1, vocab_size=320)


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with Qwen3's own chat template (shipped with TRL), which renders tools and tool calls."""
    import shutil

    import trl
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-qwen3-tools")
    shutil.copytree(tiny_model_dir, folder, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer.save_pretrained(folder)
    return str(folder)
