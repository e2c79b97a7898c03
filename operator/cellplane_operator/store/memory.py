"""An in-process fake of ``KeyValueStore`` with etcd's semantics, for unit tests.

Revisions, versions, transactions, leases and watches behave as etcd's do (the same
contract tests run on both, tests/storecontract.py). Leases run on the monotonic
clock it is given: a lease whose TTL has passed is ended, and its keys deleted, at
the next operation on the store, which is when a client of etcd would notice it too.
``unavailable`` makes every operation fail as an etcd without quorum does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from cellplane_operator.clock import MonotonicClock, SystemClock
from cellplane_operator.errors import StoreError, StoreUnavailableError
from cellplane_operator.store.base import Compare, Delete, Put, VersionedValue, WatchEvent

__all__ = ["InMemoryStore"]


@dataclass
class _Lease:
    ttl: int
    expires_at: float
    keys: set[str]


class InMemoryStore:
    def __init__(self, clock: MonotonicClock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._data: dict[str, VersionedValue] = {}
        self._lease_of: dict[str, int] = {}
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x1000)
        self._revision = 0
        self._history: list[WatchEvent] = []
        self._watchers: list[asyncio.Queue[WatchEvent]] = []
        self.unavailable = False
        """While True every operation raises ``StoreUnavailableError`` (no quorum)."""

    def _begin(self, what: str) -> None:
        if self.unavailable:
            raise StoreUnavailableError(f"the in-memory store is unavailable: {what} not confirmed")
        now = self._clock.monotonic()
        for lease_id in [i for i, lease in self._leases.items() if lease.expires_at <= now]:
            self._end_lease(lease_id)

    def _end_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None or not lease.keys:
            return
        self._revision += 1
        for key in sorted(lease.keys):
            self._remove(key)

    def _remove(self, key: str) -> None:
        """Deletes ``key`` at the current revision (the caller has moved it on)."""
        self._data.pop(key)
        self._detach(key)
        self._publish(WatchEvent("delete", key, b"", self._revision))

    def _write(self, key: str, value: bytes, lease_id: int | None) -> None:
        previous = self._data.get(key)
        self._data[key] = VersionedValue(value, self._revision, previous.version + 1 if previous else 1)
        self._detach(key)
        if lease_id is not None:
            self._leases[lease_id].keys.add(key)
            self._lease_of[key] = lease_id
        self._publish(WatchEvent("put", key, value, self._revision))

    def _detach(self, key: str) -> None:
        lease_id = self._lease_of.pop(key, None)
        if lease_id is not None and lease_id in self._leases:
            self._leases[lease_id].keys.discard(key)

    def _publish(self, event: WatchEvent) -> None:
        self._history.append(event)
        for queue in self._watchers:
            queue.put_nowait(event)

    def _holds(self, compare: Compare) -> bool:
        current = self._data.get(compare.key)
        if compare.target == "version":
            return (current.version if current else 0) == compare.value
        if compare.target == "mod_revision":
            return (current.mod_revision if current else 0) == compare.value
        return current is not None and current.value == compare.value

    async def get(self, key: str) -> VersionedValue | None:
        self._begin(f"get {key}")
        return self._data.get(key)

    async def get_prefix(self, prefix: str) -> dict[str, VersionedValue]:
        self._begin(f"get prefix {prefix}")
        return {key: value for key, value in sorted(self._data.items()) if key.startswith(prefix)}

    async def read(self, *keys: str) -> dict[str, VersionedValue | None]:
        self._begin(f"read {', '.join(keys)}")
        return {key: self._data.get(key) for key in keys}

    async def put(self, key: str, value: bytes) -> int:
        self._begin(f"put {key}")
        self._revision += 1
        self._write(key, value, None)
        return self._revision

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        return await self.transaction([Compare(key, "mod_revision", mod_revision)],
                                      [Put(key, value)], what=f"compare-and-put {key}")

    async def delete(self, key: str) -> bool:
        self._begin(f"delete {key}")
        if key not in self._data:
            return False
        self._revision += 1
        self._remove(key)
        return True

    async def transaction(self, compares: Sequence[Compare], success: Sequence[Put | Delete], *,
                          what: str) -> bool:
        self._begin(what)
        for operation in success:
            if isinstance(operation, Put) and operation.lease_id is not None \
                    and operation.lease_id not in self._leases:
                raise StoreError(f"etcd refused {what}: requested lease not found")
        if not all(self._holds(compare) for compare in compares):
            return False
        changes = [op for op in success if isinstance(op, Put) or op.key in self._data]
        if changes:
            self._revision += 1
        for operation in changes:
            if isinstance(operation, Put):
                self._write(operation.key, operation.value, operation.lease_id)
            else:
                self._remove(operation.key)
        return True

    async def grant_lease(self, ttl_seconds: int) -> tuple[int, int]:
        self._begin(f"grant lease ttl={ttl_seconds}")
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = _Lease(ttl_seconds, self._clock.monotonic() + ttl_seconds, set())
        return lease_id, ttl_seconds

    async def keep_alive(self, lease_id: int) -> int:
        self._begin(f"keep-alive lease {lease_id}")
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0
        lease.expires_at = self._clock.monotonic() + lease.ttl
        return lease.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        self._begin(f"revoke lease {lease_id}")
        self._end_lease(lease_id)

    async def watch_prefix(self, prefix: str, *, start_revision: int | None = None
                           ) -> AsyncIterator[WatchEvent]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self._watchers.append(queue)
        # Taken with the queue's registration, before anything can be written: what is
        # already written is replayed from here, everything later arrives on the queue.
        backlog = list(self._history)
        first = self._revision + 1 if start_revision is None else start_revision
        try:
            for event in backlog:
                if event.mod_revision >= first and event.key.startswith(prefix):
                    yield event
            while True:
                event = await queue.get()
                if event.mod_revision >= first and event.key.startswith(prefix):
                    yield event
        finally:
            self._watchers.remove(queue)

    async def close(self) -> None:
        return None
