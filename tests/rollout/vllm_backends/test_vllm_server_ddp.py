"""Two training processes (torchrun, gloo) on one `vllm serve` server: the main process loads the adapters, the
other sends its calls under the names it loaded them under, and both read from the server's answers which version
served each call. A stand-in server on 127.0.0.1 keeps vLLM's adapter rules (tests/vllm_stand_in.py); no vLLM needed.
"""

from __future__ import annotations

import json
import sys

import pytest
from harness import TESTS, run_offline
from vllm_stand_in import start_stand_in, stop_stand_in


@pytest.mark.slow
def test_every_process_sends_and_reads_the_names_the_main_process_loaded(tiny_model_dir, tmp_path):
    server, url = start_stand_in()
    try:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29553"]
        run_offline([*command, str(TESTS / "workers" / "ddp_server_worker.py"), tiny_model_dir, str(tmp_path), url])
    finally:
        stop_stand_in(server)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["steps"] for r in ranks] == [2, 2] and ranks[0]["run"] == ranks[1]["run"]
    for rank in ranks:  # each step's calls served by the version synced for that step, as the server said
        assert rank["stamps"] == [
            [step, [[role, role, step, "vllm-server"] for role in ("evaluator", "generator")]] for step in (0, 1)
        ]
    loads = [body["lora_name"] for route, body in server.posts if route == "/v1/load_lora_adapter"]
    assert len(loads) == len(set(loads)) == 2 * 2 + 1  # two adapters per step and the zero one, loaded once each
    assert {name.split("@")[1].split(".")[0] for name in loads} == {ranks[0]["run"]}
