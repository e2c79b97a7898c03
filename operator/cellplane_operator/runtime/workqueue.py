"""One per-key work queue for the controllers, level-triggered as client-go's is.

A key is added when something about it may have changed (a watch event, a resync, a
retry coming due); a worker then reconciles it from what is current, so adding a key
twice before it runs runs it once. At most one reconcile of a key is in flight: a key
added while its reconcile runs is run again once after it, so no change is missed and
none is acted on twice at once. A reconcile that fails is retried with a backoff that
doubles per key up to a ceiling (``RetrySchedule``), each distinct failure logged once
(``FailureLog``). A reconcile that ends waiting for something it cannot see change
asks for a retry itself (``later``), and says when the key is done (``done``): the
backoff then starts from the first delay again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

from cellplane_operator.aio import running
from cellplane_operator.errors import CellplaneError
from cellplane_operator.runtime.retries import FailureLog, RetrySchedule

__all__ = ["WorkQueue"]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, reconcile: Callable[[K], Awaitable[None]], *, first_retry_seconds: float,
                 retry_ceiling_seconds: float,
                 ignored: tuple[type[BaseException], ...] = ()) -> None:
        """``ignored``: failures that are nobody's news and not retried (e.g. this
        operator stopped leading: the next leader reconciles the key)."""
        self._reconcile = reconcile
        self._ignored = ignored
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._retries: RetrySchedule[K] = RetrySchedule(
            self.add, first_seconds=first_retry_seconds, ceiling_seconds=retry_ceiling_seconds,
            call_later=lambda delay, wake: asyncio.get_running_loop().call_later(delay, wake))
        self._failures: FailureLog[K] = FailureLog()

    def add(self, key: K) -> None:
        """``key`` may have changed: reconcile it (once, however often it is added first)."""
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def changed(self, key: K) -> None:
        """``key`` itself changed: reconcile it now, and back off from scratch if it fails."""
        self._retries.reset(key)
        self.add(key)

    def later(self, key: K) -> None:
        """Reconcile ``key`` again after its backoff (one retry pending at most)."""
        self._retries.later(key)

    def done(self, key: K) -> None:
        """``key`` reached what it asks for: a later wait backs off from the first delay."""
        self._retries.reset(key)

    def resync(self, keys: Iterable[K]) -> None:
        """Adds every key but those waiting for a retry: a key that keeps failing is
        tried at its backoff, not at every resync."""
        for key in keys:
            if not self._retries.waiting(key):
                self.add(key)

    async def run(self, workers: int) -> None:
        """Reconciles with ``workers`` at once until cancelled."""
        async with running(*(self._work() for _ in range(workers))) as tasks:
            await asyncio.gather(*tasks)

    async def resync_every(self, seconds: float, keys: Callable[[], Iterable[K]]) -> None:
        """Resyncs ``keys()`` every ``seconds`` until cancelled (level-triggered: a missed
        event is caught at the next resync)."""
        while True:
            await asyncio.sleep(seconds)
            self.resync(list(keys()))

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            if key in self._active:
                self._dirty.add(key)
                continue
            self._active.add(key)
            try:
                await self._reconcile(key)
                self._failures.cleared(key)
            except self._ignored:
                pass
            except CellplaneError as error:
                # Each distinct failure once; its repeats at every backed-off retry are
                # not news (the retry's delay doubles up to its ceiling).
                if self._failures.is_new(key, str(error)):
                    log.warning("%s: %s (retrying with backoff; said once)", key, error)
                else:
                    log.debug("%s: %s", key, error)
                self._retries.later(key)
            except Exception as error:
                if self._failures.is_new(key, f"{type(error).__name__}: {error}"):
                    log.exception("reconcile of %s failed", key)
                self._retries.later(key)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)
