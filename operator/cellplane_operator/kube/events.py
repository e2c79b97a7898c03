"""Events aggregated as client-go's recorder does: a repeat is a count, not a new object.

An operator that says "ProcessRestarted" every resync would otherwise create an
Event each time, each kept an hour by the apiserver. client-go's event
correlator keys an Event by its involved object, type, reason, message and
source; a repeat of one it posted patches ``count`` and ``lastTimestamp`` of the
Event already there. So does ``EventRecorder``, for repeats within
``AGGREGATE_WINDOW`` (client-go's ten minutes), remembering at most
``CACHE_SIZE`` keys (its LRU's 4096). The decision (``decide``) is pure; the
recorder applies it through any ``EventWriter`` (the client, or a test's fake).
If the Event patched is gone (its hour ran out), a new one is created.
"""

from __future__ import annotations

import collections
import datetime
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cellplane_operator.errors import KubeNotFoundError

__all__ = ["EventRecorder", "EventWriter", "EventKey", "Seen", "Create", "Bump", "decide",
           "AGGREGATE_WINDOW", "CACHE_SIZE"]

AGGREGATE_WINDOW = datetime.timedelta(minutes=10)
CACHE_SIZE = 4096


@dataclass(frozen=True)
class EventKey:
    namespace: str
    kind: str
    name: str
    uid: str
    type_: str
    reason: str
    message: str
    component: str


@dataclass(frozen=True)
class Seen:
    """The Event posted for a key: its name, count and first timestamp."""

    name: str
    count: int
    first: datetime.datetime
    last: datetime.datetime


@dataclass(frozen=True)
class Create:
    pass


@dataclass(frozen=True)
class Bump:
    name: str
    count: int


def decide(seen: Seen | None, now: datetime.datetime,
           window: datetime.timedelta = AGGREGATE_WINDOW) -> Create | Bump:
    """A new Event, or the count of the one posted for the same key within ``window``."""
    if seen is None or now - seen.last > window or now < seen.first:
        return Create()
    return Bump(seen.name, seen.count + 1)


class EventWriter(Protocol):
    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None: ...


class EventRecorder:
    def __init__(self, writer: EventWriter, *, window: datetime.timedelta = AGGREGATE_WINDOW,
                 cache_size: int = CACHE_SIZE) -> None:
        self._writer, self._window, self._size = writer, window, cache_size
        self._seen: collections.OrderedDict[EventKey, Seen] = collections.OrderedDict()

    async def record(self, involved: Mapping[str, Any], *, type_: Literal["Normal", "Warning"],
                     reason: str, message: str, component: str,
                     now: datetime.datetime) -> None:
        """Posts the Event, or counts it on the same Event posted within the window."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        message = message[:1024]
        key = EventKey(namespace, str(involved.get("kind")), str(meta.get("name")),
                       str(meta.get("uid")), type_, reason, message, component)
        stamp = _stamp(now)
        seen = self._seen.get(key)
        plan = decide(seen, now, self._window)
        if isinstance(plan, Bump) and seen is not None:
            try:
                await self._writer.patch_event(namespace, plan.name,
                                               {"count": plan.count, "lastTimestamp": stamp})
            except KubeNotFoundError:
                plan = Create()
            else:
                self._remember(key, Seen(plan.name, plan.count, seen.first, now))
                return
        name = f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}"
        await self._writer.create_event(namespace, {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"apiVersion": involved.get("apiVersion"),
                               "kind": involved.get("kind"), "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": type_, "reason": reason, "message": message,
            "source": {"component": component}, "reportingComponent": component,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })
        self._remember(key, Seen(name, 1, now, now))

    def _remember(self, key: EventKey, seen: Seen) -> None:
        self._seen[key] = seen
        self._seen.move_to_end(key)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)


def _stamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
