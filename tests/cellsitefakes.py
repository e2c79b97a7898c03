"""Cell site runners wired as runtime/region.py wires them, over the fakes of every port:
InMemoryStore (etcd), the fake apiserver with its watch (regionfakes.WatchedKube), and
InMemorySites (every region's sites and their databases), on the system clock.

``CellWorld`` is what the regions share; ``RegionSite`` one region's operator as far as
one cell goes: its ``CellSiteRunner``, fed the Cell by the watch as kopf feeds it, and
its own connection to etcd, which a test can cut (a partition).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from cellplane_operator.cellmemory import InMemoryCells
from cellplane_operator.clock import SystemClock
from cellplane_operator.errors import StoreUnavailableError
from cellplane_operator.kube import CELLS, EVENTS
from cellplane_operator.ownership.table import GroupView, OwnershipTable
from cellplane_operator.runtime.cache import ObjectCache
from cellplane_operator.runtime.objects import CellObject
from cellplane_operator.runtime.cellsite import CellSiteRunner
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.settings import OperatorSettings
from cellplane_operator.sites.base import SiteKey
from cellplane_operator.sites.memory import FakeSite, InMemorySites
from cellplane_operator.sites.reports import SiteReport, SiteReports
from cellplane_operator.store import (
    Compare, Delete, InMemoryStore, KeyValueStore, Put, VersionedValue, WatchEvent,
)
from regionfakes import WatchedKube, eventually

__all__ = ["CellWorld", "RegionSite", "CLOCK", "LEASE", "CELL", "eventually"]

CLOCK = SystemClock()
LEASE = {"durationSeconds": 3, "renewIntervalSeconds": 0.5, "marginSeconds": 1}
"""Short enough for a takeover in about four seconds; a renewal may be late by a second
(a busy machine) without the owner fencing itself."""
CELL = "shared-a1"


class CutOffStore:
    """One region's way to the shared etcd, which a partition can cut. Remembers when the
    last renewal that etcd confirmed was sent: the owner's lease ends a TTL after it."""

    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self.cut = False
        self.last_renewal_sent: float | None = None

    def _reach(self) -> KeyValueStore:
        if self.cut:
            raise StoreUnavailableError("partitioned from etcd")
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
        sent = CLOCK.monotonic()
        granted = await self._reach().grant_lease(ttl_seconds)
        self.last_renewal_sent = sent
        return granted

    async def keep_alive(self, lease_id: int) -> int:
        sent = CLOCK.monotonic()
        ttl = await self._reach().keep_alive(lease_id)
        self.last_renewal_sent = sent
        return ttl

    async def revoke_lease(self, lease_id: int) -> None:
        await self._reach().revoke_lease(lease_id)

    async def watch_prefix(self, prefix: str, *, start_revision: int | None = None
                           ) -> AsyncIterator[WatchEvent]:
        async for event in self._store.watch_prefix(prefix, start_revision=start_revision):
            if not self.cut:
                yield event

    async def close(self) -> None:
        return None


class CellWorld:
    """What every region shares: etcd, the apiserver and the sites."""

    def __init__(self, state_dir: Path) -> None:
        self.store = InMemoryStore(CLOCK)
        self.kube = WatchedKube()
        self.sites = InMemorySites(CLOCK)
        self.state_dir = state_dir
        self.regions: list[RegionSite] = []

    async def create_cell(self, *, standby_regions: tuple[str, ...] = (),
                          max_standby_lag_seconds: float = 30) -> dict[str, Any]:
        return await self.kube.create(CELLS, {
            "apiVersion": "cellplane.io/v1alpha1", "kind": "Cell", "metadata": {"name": CELL},
            "spec": {"region": "region-a", "tier": "shared",
                     "capacity": {"tenants": 10, "workerSlots": 20},
                     "standbyRegions": list(standby_regions),
                     "failover": {"maxStandbyLagSeconds": max_standby_lag_seconds},
                     "lease": LEASE, "driver": {"allowPrivateTargets": True}}})

    async def region(self, region: str) -> RegionSite:
        started = RegionSite(self, region)
        await started.start()
        self.regions.append(started)
        return started

    async def close(self) -> None:
        for region in self.regions:
            await region.stop()

    def site(self, region: str) -> FakeSite | None:
        return self.sites.sites.get(SiteKey(CELL, region))

    async def status(self) -> dict[str, Any]:
        return dict((await self.kube.get(CELLS, CELL) or {}).get("status") or {})

    async def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in await self.kube.list(EVENTS, namespace="default")
                if e["reason"] == reason and e["involvedObject"]["name"] == CELL]

    async def group(self) -> GroupView:
        return await OwnershipTable(self.store).read_group(CELL)

    async def report(self, region: str) -> SiteReport | None:
        return await SiteReports(self.store).read(CELL, region)


class RegionSite:
    """One region's operator for the cell: its site runner, started as RegionRuntime starts it."""

    def __init__(self, world: CellWorld, region: str) -> None:
        self.world = world
        self.region = region
        self.site = SiteKey(CELL, region)
        self.store = CutOffStore(world.store)
        self.cache = ObjectCache()
        self.ctx = RegionContext(
            settings=OperatorSettings(region=region, member=f"{region}-1",
                                      state_dir=world.state_dir / region,
                                      site_check_seconds=0.1),
            store=self.store, kube=world.kube, driver=world.sites, clock=CLOCK,
            cells=InMemoryCells(), cache=self.cache, reports=SiteReports(self.store),
            databases=world.sites)
        self.runner: CellSiteRunner | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.cache.on_cell.append(self._cell_changed)
        await self.world.kube.subscribe(self.cache)
        self.runner = CellSiteRunner(self.ctx, self.cache.cells[CELL].body)
        self._task = asyncio.create_task(self.runner.run(self._stop), name=f"site-{self.region}")

    def _cell_changed(self, name: str, _before: CellObject | None,
                      cell: CellObject | None) -> None:
        if name == CELL and cell is not None and self.runner is not None:
            self.runner.update(cell.body)

    async def stop(self, *, detach: bool = False) -> None:
        """A clean stop releases the lease; ``detach`` leaves it to run out."""
        if self.runner is not None and detach:
            self.runner.detach()
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.cache in self.world.kube.caches:
            self.world.kube.caches.remove(self.cache)
        await self.ctx.close()

    async def lose(self) -> None:
        """The region is lost whole: its sites answer nothing, its operator is gone, and its
        lease runs out (nobody releases it)."""
        self.world.sites.lose_region(self.region)
        await self.stop(detach=True)

    async def passes(self, count: int) -> None:
        """Waits until the runner has checked its site ``count`` more times."""
        site = self.world.sites.sites[self.site]
        target = site.checks + count

        async def passed() -> bool:
            return site.checks >= target
        await eventually(passed, f"{count} passes of the {self.region} runner")
