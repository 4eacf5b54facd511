#!/usr/bin/env bash
# usage: .ci/newest_upstream.sh build VENV   (a venv with the newest TRL and PEFT the registry serves, past our caps)
#        .ci/newest_upstream.sh test VENV    (the seam and TRL-compatibility tests there; prints what broke)
#
# TRL and PEFT are capped (setup.cfg) because the trainer reaches their private hooks (trl_multiagent/seams/,
# grpo_seam.py). The day either ships a release past the cap, this shows what it breaks, without failing CI: `test`
# always exits 0, and its tests stop after TEST_SECONDS (default 200). Where nothing newer than our ranges exists, it
# says so and runs nothing (the main venv tested those releases already).
set -uo pipefail
cd "$(dirname "$0")/.."
action=${1:?build or test}
venv=${2:?the venv folder}
python=$venv/bin/python

if [[ $action == build ]]; then
    set -e
    python3 -m venv "$venv"
    "$python" -m pip install -q --upgrade pip
    "$python" -m pip install -q torch==2.13.0 # the CPU wheel first, as in the main venv
    "$python" -m pip install -q -e ".[test]"
    # pip resolves only what it is asked for here, so the package's caps do not hold the upgrade back (it prints the
    # conflict with them, which is the point). TRL and PEFT may pull newer transformers or accelerate with them.
    "$python" -m pip install -q --upgrade trl peft -c <(echo "torch==2.13.0")
    exit 0
fi
if [[ $action != test ]]; then
    echo "unknown action $action: build or test"
    exit 0
fi
if ! "$python" -c "import trl, peft, trl_multiagent" 2>/dev/null; then
    echo "newest TRL/PEFT: $venv did not build; nothing tested (its build log is above)"
    exit 0
fi
# One line for TRL and one for PEFT; exits 1 when either is past the range the package declares.
if "$python" .ci/past_our_range.py trl peft; then
    echo "newest TRL/PEFT: nothing newer than our ranges allow, which the main venv's tests covered"
    exit 0
fi
"$python" -m pip list 2>/dev/null | grep -iE "^(torch|transformers|accelerate|peft|trl) "
seconds=${TEST_SECONDS:-200}
timeout --kill-after=10 "$seconds" "$python" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --tb=line -rfE \
    tests/trl_compat tests/package/test_seams.py
status=$?
case $status in
0) echo "newest TRL/PEFT: the seam and TRL-compatibility tests pass" ;;
124 | 137) echo "newest TRL/PEFT: stopped after ${seconds} s; the failures above are those seen by then" ;;
*) echo "newest TRL/PEFT: the tests above failed (exit $status): what the next release needs fixed" ;;
esac
exit 0
