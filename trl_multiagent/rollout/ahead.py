"""``rollout_ahead=1``: the next generation batch's episodes run while the trainer trains on the current one.

TRL's loop hands the trainer one generation batch per optimizer step (the same rows ``gradient_accumulation_steps``
times). ``peek`` wraps the trainer's data iterator so the next batch's rows are known one step early; ``episodes``
returns the current batch's episodes (run ahead during the previous step, or now when none were) and starts the next
batch's on a worker thread, with the adapters as they are now. The episodes a step trains on were so sampled with the
adapters of one optimizer step before (bounded off-policy); the vLLM path's sampled log-probs feed TRL's importance
sampling correction, which reweighs them. A batch that was not peeked (the first of each epoch) runs on the spot.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any


class RolloutsAhead:
    """``run(rows) -> episodes`` runs the episodes of a generation batch's rows; ``sync()`` sends the current adapters
    to the backend if they changed since the last sync; ``more_steps()`` says whether another training step follows
    this one. With ``ahead=False`` it syncs and runs each batch when asked, and reads nothing early."""

    def __init__(
        self, run: Callable[[list], list], sync: Callable[[], None], more_steps: Callable[[], bool], *, ahead: bool
    ):
        self.run, self.sync, self.more_steps, self.ahead = run, sync, more_steps, ahead
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
        self._peeked: list = []  # the item after the current step's, read early and handed out first next time
        self._ahead: tuple[list, concurrent.futures.Future] | None = None  # (prompts, their running episodes)
        self.waited_s = 0.0  # how long the last step waited for its episodes (ahead: small, the rollout overlapped)
        self.ran_ahead = False  # the last episodes handed out ran during the step before (sampled one step earlier)

    def around(self, epoch_iterator: Iterator, take: Callable[[Iterator], Any]) -> Any:
        """``take(batches)`` on the trainer's data iterator, the item read early last time first; then read the
        item that follows (the next generation batch's rows) early."""
        if not self.ahead:
            return take(epoch_iterator)
        source = itertools.chain(self._peeked, epoch_iterator)
        taken = take(source)
        self._peeked = list(itertools.islice(source, 1))
        return taken

    def episodes(self, rows: list[dict], training: bool = True) -> list:
        """The episodes of ``rows`` (run ahead, or now); then, in training, the next batch's start on the worker
        thread."""
        started, prompts = time.perf_counter(), [row["prompt"] for row in rows]
        if not (self.ahead and training):
            self.settle()  # nothing else uses the backend while a rollout runs ahead (an evaluation waits)
            self.sync()
            episodes = self.run(rows)
            self.waited_s, self.ran_ahead = time.perf_counter() - started, False
            return episodes
        self.ran_ahead = self._ahead is not None and self._ahead[0] == prompts
        if self.ran_ahead:
            episodes = self._ahead[1].result()  # a failed rollout raises here, naming its episode
        else:
            self.settle()
            self._ahead = None
            self.sync()
            episodes = self.run(rows)
        self.waited_s = time.perf_counter() - started
        self._ahead = None
        if self._peeked and self.more_steps():
            following = self._peeked[0]
            self.sync()  # the adapters as this step finds them: the next batch samples with them
            self._ahead = ([row["prompt"] for row in following], self._pool.submit(self.run, following))
        return episodes

    def settle(self) -> None:
        """Wait until no rollout runs ahead (before anything else uses the backend: an evaluation, a sync)."""
        if self._ahead is not None:
            concurrent.futures.wait([self._ahead[1]])

    def close(self) -> None:
        self.settle()
        self._ahead = None
        self._pool.shutdown(wait=True)
