import os
import sys
from pathlib import Path

# The shared helpers (harness, tiny, scripted, presets, reference_rules, preemption, workers/) live here, beside the
# folders (training/, rollout/, ...): every folder imports them by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # a tiny GRPO step is ~10x faster with one thread than with two on these machines


@pytest.fixture(autouse=True)
def no_deepspeed_config_left_behind():
    """A ZeRO-3 ``TrainingArguments`` built in this process (``--validate`` under a DeepSpeed launch, say) makes
    transformers' module-level DeepSpeed config live until the garbage collector frees it; while it lives, every
    later ``from_pretrained`` of this process partitions the model with ``deepspeed.zero.Init``, which needs a
    distributed launch. A process starts each test without one."""
    yield
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


@pytest.fixture(scope="session")
def extensions_dir() -> str:
    """`TORCH_EXTENSIONS_DIR` of every DeepSpeed child process: the op DeepSpeed compiles on first use (its CPU
    accelerator's shared-memory communication, one to two minutes here) is compiled once per checkout, into the
    folder tests/recipes/test_documented_commands.py uses too (torch's JIT builds it again when its sources or flags
    change)."""
    folder = Path(__file__).resolve().parent.parent / ".pytest_cache" / "extensions"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


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


@pytest.fixture(scope="session")
def tiny_moe_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A tiny Qwen3-MoE (4 experts, 2 per token) with the tiny model's tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    dense = AutoConfig.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = Qwen3MoeConfig(
        vocab_size=dense.vocab_size,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    folder = str(tmp_path_factory.mktemp("tiny-qwen3-moe"))
    Qwen3MoeForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
