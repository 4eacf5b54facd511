"""accelerate below its public surface (the names ``accelerate`` and ``accelerate.utils`` export, as its reference
documents them). Checked against accelerate 1.10.1 (setup.cfg's floor) and 1.16."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gradients_unsynced(accelerator) -> Iterator[None]:
    """While it lasts, ``accelerator`` treats backward passes as inside an accumulation: its ``backward`` neither steps
    a DeepSpeed engine nor syncs gradients. The Trainer sets ``GradientState.sync_gradients`` for the whole last
    micro-step of an accumulation through the private setter ``GradientState._set_sync_gradients`` (since 0.11; it
    also arms XLA's gradient sync), and so does this, restoring the value after."""
    state = accelerator.gradient_state
    synced = state.sync_gradients
    state._set_sync_gradients(False)
    try:
        yield
    finally:
        state._set_sync_gradients(synced)
