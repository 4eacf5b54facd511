"""The sandbox under a burst (benchmarks/sandbox_burst.py): many programs at once, a share of them hostile, on more
sandboxes than cores. Every verdict must be the one its program's kind gets alone, no hostile program may harm the
host, nothing may be left running or on disk, and a busy honest program passes although it waits for a CPU far
longer than its time limit."""

import re
import sys

import pytest
from harness import ROOT, needs_sandbox, run_offline

pytestmark = [needs_sandbox, pytest.mark.slow]


def test_a_burst_of_programs_a_fifth_hostile_on_16_sandboxes_a_core(tmp_path):
    done = run_offline(
        [sys.executable, str(ROOT / "benchmarks" / "sandbox_burst.py"), "--programs", "50", "--hostile", "0.2"]
        + ["--workers", "32", "--busy", "0.5"],
        cwd=tmp_path,
        timeout=900,
    )
    result = dict(re.findall(r"(\w+)=(\S+)", done.stdout.strip().splitlines()[-1]))
    assert (result["programs"], result["hostile"]) == ("50", "10")
    assert (result["wrong_verdicts"], result["escaped"], result["left_behind"]) == ("0", "0", "0")
    # 8 of the 40 honest programs spin 0.5 CPU s: at 16 sandboxes a core, ~8 s of wall-clock time, over the 3 s limit
    assert re.search(r"honest, busy 0.5 CPU s -> passed +\{'passed': 8\}", done.stdout), done.stdout
