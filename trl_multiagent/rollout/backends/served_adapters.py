"""The names under which one trainer's adapter versions are loaded into `vllm serve` servers.

A server outlives trainers: it may still hold adapters that another run loaded, or that this run loaded in an earlier
life (before a crash and a resume), and two trainers may share it. Under the adapters' own names (``generator``) a
trainer would meet "already loaded" errors there, or silently replace another run's weights. So every version of an
adapter is loaded under a name of its own, ``<adapter>@<run>.<n>``: ``run`` is drawn afresh for each trainer (shared
by its processes), ``n`` counts the versions it loads. A request names the version it wants, and vLLM's answer names
the adapter that served it (its ``model`` field): a call's provenance is read from the server's own answer, mapped back
to (adapter, optimizer step) here.

Every process of a run keeps the same names: the main process loads them (``loaded``) and the others follow the same
sequence (``followed``) without loading anything, so every process can send requests and read the stamps.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from ...adapters.routing import BASE_MODEL
from .base import Provenance

BACKEND = "vllm-server"
NO_STEP, NOT_LOADED = -1, -2  # a version of the zero adapter (or with no clock); a name given, not loaded yet


class ServedAdapters:
    """``run``: this trainer's tag, the same in every process; ``weights_step()``: the optimizer step of the weights
    being loaded (the trainer's ``global_step``), None: no clock."""

    def __init__(self, adapter_names: Sequence[str], run: str, weights_step: Callable[[], int] | None = None):
        if BASE_MODEL in adapter_names:
            raise ValueError(f"{BASE_MODEL!r} is reserved for the base model and cannot name an adapter.")
        self.adapter_names = list(adapter_names)
        self.run = run
        self.weights_step = weights_step
        self.current: dict[str, str] = {}  # adapter -> the served name of its newest version
        # Every name this run gave, by its serial ``n``: which adapter (an index into ``_adapters``) at which
        # optimizer step (or NO_STEP, or NOT_LOADED). A run loads a version per adapter at each weight sync, so over
        # a day of short steps these are tens of thousands: kept as two flat arrays (10 bytes a version) rather than
        # a dict of names, which held about 250 bytes each.
        self._adapters = [*self.adapter_names, BASE_MODEL]
        self._adapter_of = array("h")
        self._step_of = array("q")

    def to_sync(self, adapter_names: Sequence[str] | None) -> list[str]:
        """The adapters a sync loads: the given ones (default: all), plus the zero adapter the first time."""
        names = list(adapter_names if adapter_names is not None else self.adapter_names)
        return names if BASE_MODEL in self.current else [*names, BASE_MODEL]

    def next_name(self, adapter: str) -> str:
        """The name the next version of ``adapter`` is loaded under. Each call takes a serial of its own, so a load
        that failed part-way (on some servers only) is retried under a new name, never one a server may hold."""
        self._adapter_of.append(self._adapters.index(adapter))
        self._step_of.append(NOT_LOADED)
        return f"{adapter}@{self.run}.{len(self._step_of) - 1}"

    def loaded(self, adapter: str, name: str) -> str | None:
        """Every server now holds ``name`` (from ``next_name``) for ``adapter``: requests name it from now on.
        Returns the name it replaces (to unload), if any."""
        serial = self._serial_of(name, adapter)
        if serial is None or self._step_of[serial] != NOT_LOADED:
            raise ValueError(f"{name!r} is not a name that next_name gave {adapter!r} and that is not loaded yet.")
        trained = adapter != BASE_MODEL and self.weights_step is not None  # the zero adapter stands for the base
        self._step_of[serial] = self.weights_step() if trained else NO_STEP
        previous, self.current[adapter] = self.current.get(adapter), name
        return previous

    def _serial_of(self, served: str | None, adapter: str | None = None) -> int | None:
        """The serial ``n`` of ``<adapter>@<run>.<n>``, where this run gave that name to that adapter; else None."""
        name, at, rest = (served or "").partition("@")
        run, dot, serial = rest.rpartition(".")
        if not (at and dot and run == self.run and serial.isdigit()) or int(serial) >= len(self._step_of):
            return None
        n = int(serial)
        given_to = self._adapters[self._adapter_of[n]]
        return n if given_to == name and (adapter is None or adapter == name) else None

    def version_of(self, served: str | None) -> tuple[str, int | None] | None:
        """(adapter, optimizer step or None) of a name this run loaded; None for any other name."""
        serial = self._serial_of(served)
        if serial is None or self._step_of[serial] == NOT_LOADED:
            return None
        step = self._step_of[serial]
        return self._adapters[self._adapter_of[serial]], (None if step == NO_STEP else step)

    def followed(self, adapter_names: Sequence[str] | None) -> None:
        """Another process loaded the next versions of ``adapter_names``: take the same names."""
        for adapter in self.to_sync(adapter_names):
            self.loaded(adapter, self.next_name(adapter))

    def name_of(self, adapter: str) -> str:
        return self.current[adapter]

    def provenance(self, served: str | None) -> Provenance:
        """What served a call, from the name the server answered with: an unknown name (another run's, or none)
        stands as it is, with no version, and fails the adapter check (which names the run it belongs to,
        ``other_run``)."""
        adapter, version = self.version_of(served) or (str(served), None)
        return Provenance(adapter, version, BACKEND)

    def check_synced(self, adapters: Sequence[str]) -> None:
        missing = sorted(set(adapters) - set(self.current))
        if missing:
            unknown = sorted(set(missing) - {*self.adapter_names, BASE_MODEL})
            if unknown:
                raise KeyError(f"Adapter(s) {unknown} are not served; the servers serve {sorted(self.adapter_names)}.")
            raise RuntimeError(f"Adapter(s) {missing} were never sent to vLLM: call `sync_adapters(model)` first.")


def other_run(served: str) -> str | None:
    """The run tag of a served name ``<adapter>@<run>.<n>`` that a ``Provenance`` kept as it was (one this run never
    loaded: another run's on a shared server, or this run's from an earlier life); None for any other name."""
    adapter, at, rest = served.partition("@")
    run, dot, serial = rest.rpartition(".")
    return run if at and adapter and dot and run and serial.isdigit() else None
