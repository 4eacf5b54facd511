"""Build a tiny randomly initialised Qwen3 and its tokenizer, offline, for CPU runs of the recipes.

    python scripts/build_tiny_model.py outputs/tiny-qwen3

It runs the whole pipeline in seconds; being random, it does not learn anything useful.
"""

import sys

from trl_multiagent.testing import build_tiny_qwen3

if __name__ == "__main__":
    print(build_tiny_qwen3(sys.argv[1] if len(sys.argv) > 1 else "outputs/tiny-qwen3"))
