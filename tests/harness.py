"""What every room of the test suite shares: one check for the code sandbox, and one way to run a subprocess."""

from __future__ import annotations

import pytest

from trl_multiagent.tasks.sandbox import sandbox_available

# The sandbox runs as root or, unprivileged, inside user namespaces (`sandbox_mode`); tests that execute code skip
# only where neither works, and .ci/run runs them both ways.
needs_sandbox = pytest.mark.skipif(
    not sandbox_available(),
    reason="the code sandbox needs root or unprivileged user namespaces (trl_multiagent.tasks.sandbox.sandbox_mode "
    "says how to enable them)",
)
