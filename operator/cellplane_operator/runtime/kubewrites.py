"""Writes to the Kubernetes API made beside the work they describe, never in its way.

Kubernetes holds desired state and reports status; it is not on the path of a
failover (DESIGN.md). A region loss can take the apiserver with it, or find it
paused: a controller that awaited an Event before publishing its site waited
for the client's timeout (10 s) each time. So Events and status
are handed to a writer of their own and the caller goes on at once:

- ``EventSender``: one queue per operator, sent in order by one task; an Event
  that cannot be posted is tried again with a growing delay until it is, so an
  Event of a takeover made while the apiserver was away is posted when it comes
  back. The queue is bounded (the oldest are dropped, and that is said once).
- ``PendingWrites``: per controller, the latest wanted value of each named write
  (a status, an annotation removal); an older value not written yet is
  replaced, not queued, since status is level-triggered: the next value says
  everything the older one did. A write runs its ``then`` only once it landed.

Each distinct failure is logged once, not at every retry.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from cellplane_operator.aio import first_of
from cellplane_operator.errors import CellplaneError, KubeApiError, KubeNotFoundError
from cellplane_operator.kube.base import KubeApi

__all__ = ["EventSender", "PendingWrites", "RETRY_FIRST_SECONDS", "RETRY_CEILING_SECONDS"]

log = logging.getLogger(__name__)

RETRY_FIRST_SECONDS = 0.5
RETRY_CEILING_SECONDS = 10.0
"""A write that failed is tried again after 0.5 s, doubling up to this."""
EVENT_QUEUE_LIMIT = 1000
"""Events kept while the apiserver is away; beyond it the oldest are dropped."""


def next_delay(previous: float | None) -> float:
    return RETRY_FIRST_SECONDS if previous is None else min(previous * 2, RETRY_CEILING_SECONDS)


@dataclass(frozen=True)
class _Event:
    involved: dict[str, Any]
    type_: Literal["Normal", "Warning"]
    reason: str
    message: str
    at: datetime.datetime


class EventSender:
    """Posts Events in the order they were recorded, from a task of its own."""

    def __init__(self, kube: KubeApi, *, component: str,
                 limit: int = EVENT_QUEUE_LIMIT) -> None:
        self._kube = kube
        self._component = component
        self._queue: collections.deque[_Event] = collections.deque()
        self._limit = limit
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._dropped = 0
        self._failure_said: str | None = None

    def record(self, involved: dict[str, Any], type_: Literal["Normal", "Warning"], reason: str,
               message: str, *, at: datetime.datetime) -> None:
        if len(self._queue) >= self._limit:
            self._queue.popleft()
            self._dropped += 1
            if self._dropped == 1:
                log.warning("more than %d Events wait for the apiserver: dropping the oldest",
                            self._limit)
        self._queue.append(_Event(involved, type_, reason, message, at))
        self._ready.set()
        self._drained.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="events")

    @property
    def waiting(self) -> int:
        """Events recorded and not posted yet."""
        return len(self._queue)

    async def _send(self) -> None:
        delay: float | None = None
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            event = self._queue[0]
            try:
                await self._kube.event(event.involved, type_=event.type_, reason=event.reason,
                                       message=event.message, component=self._component,
                                       now=event.at)
            except KubeNotFoundError:
                pass  # its namespace is gone: nobody will read it
            except KubeApiError as error:
                if 400 <= error.status < 500 and error.status not in (408, 429):
                    log.warning("event %s refused, not retried: %s", event.reason, error)
                else:
                    self._say(f"cannot post events yet (retrying): {error}")
                    delay = next_delay(delay)
                    await asyncio.sleep(delay)
                    continue
            if self._queue and self._queue[0] is event:
                self._queue.popleft()
            if not self._queue:
                self._drained.set()
            delay = None
            if self._failure_said is not None or self._dropped:
                log.info("events are posted again (%d dropped meanwhile)", self._dropped)
                self._failure_said, self._dropped = None, 0

    def _say(self, failure: str) -> None:
        if failure != self._failure_said:
            self._failure_said = failure
            log.warning("%s", failure)

    async def close(self, *, drain_seconds: float = 2.0) -> None:
        """Gives the Events still queued ``drain_seconds`` to be posted, then stops."""
        if self._task is None:
            return
        if self._queue and not self._task.done():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), drain_seconds)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


Write = Callable[[], Awaitable[object]]
Then = Callable[[], Awaitable[None]]


@dataclass
class _Pending:
    write: Write
    then: Then | None


class PendingWrites:
    """The latest wanted value of each named write, written by ``run`` until it lands."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._failures_said: dict[str, str] = {}

    def offer(self, key: str, write: Write, *, then: Then | None = None) -> None:
        """``write`` replaces any value of ``key`` not written yet; returns at once."""
        self._pending[key] = _Pending(write, then)
        self._wake.set()

    def waiting(self, key: str) -> bool:
        return key in self._pending

    async def run(self, stop: asyncio.Event) -> None:
        delay: float | None = None
        while not stop.is_set():
            self._wake.clear()
            failed = False
            for key, pending in list(self._pending.items()):
                try:
                    await pending.write()
                except CellplaneError as error:
                    failed = True
                    said = str(error)
                    if self._failures_said.get(key) != said:
                        self._failures_said[key] = said
                        log.warning("%s: cannot write %s yet (retrying): %s",
                                    self._what, key, error)
                    continue
                if self._failures_said.pop(key, None) is not None:
                    log.info("%s: %s written", self._what, key)
                if self._pending.get(key) is pending:
                    del self._pending[key]
                if pending.then is not None:
                    await pending.then()
            delay = next_delay(delay) if failed else None
            # After a failure only the backoff (or the stop) ends the wait, not new work.
            wakes = (stop,) if failed else (stop, self._wake)
            await first_of(*wakes, timeout=delay)
