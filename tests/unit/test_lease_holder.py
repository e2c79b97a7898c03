"""The lease holder's whole loop (acquire, renew, self-fence, take over) over the in-memory
store, without processes; tests/integration/test_ownership_etcd.py does the same on etcd.

Leases here are 4 s long, with a 2 s margin, so each test takes a few seconds of real time. What is checked
are the safety rules, which hold however slow the machine is: a new owner never starts
before the old owner's database grant has ended, and an owner that cannot renew stops
before its lease ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from cellplane_operator.clock import SystemClock
from cellplane_operator.domain.ownership import LeaseSettings
from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.ownership.holder import HolderIdentity, LeaseHolder
from cellplane_operator.ownership.table import OwnershipTable
from cellplane_operator.store import (
    Compare, Delete, InMemoryStore, KeyValueStore, Put, VersionedValue, WatchEvent,
)

SETTINGS = LeaseSettings(duration_seconds=4, renew_interval_seconds=0.5, margin_seconds=2)
CLOCK = SystemClock()


@dataclass
class RecordingActor:
    """What a cell's database would be told: when it may accept writes until, and when to stop."""

    started: list[tuple[int, float]] = field(default_factory=list)
    grant_ends: list[float] = field(default_factory=list)
    stopped: list[tuple[int, float, str]] = field(default_factory=list)
    acting: asyncio.Event = field(default_factory=asyncio.Event)

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        now = CLOCK.monotonic()
        self.started.append((epoch, now))
        self.grant_ends.append(now + remaining_seconds)
        self.acting.set()

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        self.grant_ends.append(CLOCK.monotonic() + remaining_seconds)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        self.stopped.append((epoch, CLOCK.monotonic(), reason))
        self.acting.clear()


class CutOffStore:
    """One process's way to the shared store, which a partition can cut."""

    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self.cut = False

    def _reach(self) -> KeyValueStore:
        if self.cut:
            raise StoreUnavailableError("partitioned from the store")
        return self._store

    async def get(self, key: str) -> VersionedValue | None:
        return await self._reach().get(key)

    async def get_prefix(self, prefix: str) -> dict[str, VersionedValue]:
        return await self._reach().get_prefix(prefix)

    async def read(self, *keys: str) -> dict[str, VersionedValue | None]:
        return await self._reach().read(*keys)

    async def put(self, key: str, value: bytes) -> int:
        return await self._reach().put(key, value)

    async def put_if_revision(self, key: str, value: bytes, *, mod_revision: int) -> bool:
        return await self._reach().put_if_revision(key, value, mod_revision=mod_revision)

    async def delete(self, key: str) -> bool:
        return await self._reach().delete(key)

    async def transaction(self, compares: Sequence[Compare], success: Sequence[Put | Delete], *,
                          what: str) -> bool:
        return await self._reach().transaction(compares, success, what=what)

    async def grant_lease(self, ttl_seconds: int) -> tuple[int, int]:
        return await self._reach().grant_lease(ttl_seconds)

    async def keep_alive(self, lease_id: int) -> int:
        return await self._reach().keep_alive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._reach().revoke_lease(lease_id)

    async def watch_prefix(self, prefix: str, *, start_revision: int | None = None
                           ) -> AsyncIterator[WatchEvent]:
        async for event in self._store.watch_prefix(prefix, start_revision=start_revision):
            if not self.cut:
                yield event

    async def close(self) -> None:
        return None


@dataclass
class Process:
    region: str
    store: CutOffStore
    actor: RecordingActor
    holder: LeaseHolder
    stop: asyncio.Event
    task: asyncio.Task[None]


def start(shared: InMemoryStore, region: str) -> Process:
    store, actor, stop = CutOffStore(shared), RecordingActor(), asyncio.Event()
    holder = LeaseHolder(OwnershipTable(store), HolderIdentity("cell-1", region, "site"), actor,
                         settings=SETTINGS, clock=CLOCK)
    return Process(region, store, actor, holder, stop, asyncio.create_task(holder.run(stop)))


async def kill(process: Process) -> None:
    """Ends the process without a release: its owner key stays until its lease runs out."""
    process.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await process.task


@contextlib.asynccontextmanager
async def owner_and_candidate(shared: InMemoryStore) -> AsyncIterator[tuple[Process, Process]]:
    """region-a acting as the owner, region-b started after it; both ended at the end."""
    a = start(shared, "region-a")
    b: Process | None = None
    try:
        await asyncio.wait_for(a.actor.acting.wait(), 10)
        b = start(shared, "region-b")
        yield a, b
    finally:
        await kill(a)
        if b is not None:
            await kill(b)


async def test_one_owner_acts_and_a_takeover_starts_only_after_the_old_grant_ended() -> None:
    async with owner_and_candidate(InMemoryStore(CLOCK)) as (a, b):
        # Several renewals go by; b observes and never acts.
        await asyncio.wait_for(_until(lambda: len(a.actor.grant_ends) >= 4), 20)
        assert not b.actor.started
        await kill(a)
        old_grant_end = max(a.actor.grant_ends)
        await asyncio.wait_for(b.actor.acting.wait(), 20)
        (epoch, started_at), = b.actor.started
        assert epoch == a.actor.started[0][0] + 1
        assert started_at >= old_grant_end, (
            f"b started {old_grant_end - started_at:.2f} s before a's database grant ended")


async def test_an_owner_cut_off_from_the_store_stops_before_its_lease_ends() -> None:
    async with owner_and_candidate(InMemoryStore(CLOCK)) as (a, b):
        await asyncio.wait_for(_until(lambda: len(a.actor.grant_ends) >= 2), 20)
        a.store.cut = True
        await asyncio.wait_for(_until(lambda: bool(a.actor.stopped)), 20)
        (_, stopped_at, reason), = a.actor.stopped
        assert "self-fenced" in reason
        # The watchdog fires when the database's grant ends (the database also stops by
        # itself then); the lease ends a margin later.
        lease_end = max(a.actor.grant_ends) + SETTINGS.margin_seconds
        assert stopped_at < lease_end, f"stopped {stopped_at - lease_end:.2f} s after its lease"
        await asyncio.wait_for(b.actor.acting.wait(), 20)
        assert b.actor.started[0][1] >= max(a.actor.grant_ends)
        assert not a.actor.acting.is_set()


async def test_a_release_hands_over_without_waiting_for_the_lease() -> None:
    shared = InMemoryStore(CLOCK)
    async with owner_and_candidate(shared) as (a, b):
        lease_id = a.holder.state.lease_id
        assert lease_id is not None
        assert await a.holder.release()
        # Released, the owner key and its lease are gone at once: b waits only the margin
        # after seeing that, not for the lease to run out.
        assert await shared.get(OwnershipTable(shared).owner_key("cell-1")) is None
        assert await shared.keep_alive(lease_id) <= 0
        a.stop.set()
        await asyncio.wait_for(b.actor.acting.wait(), 20)
        assert a.actor.stopped and a.actor.stopped[0][1] <= b.actor.started[0][1]


async def _until(condition: object) -> None:
    while not condition():  # type: ignore[operator]
        await asyncio.sleep(0.05)
