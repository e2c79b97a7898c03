"""A restarted holder continues its predecessor's live lease, under the same epoch.

Real 3-member etcd. The predecessor is a ``LeaseHolder`` whose task is cancelled
(its process "died": no release, the owner key stays until its lease runs out).
"""

from __future__ import annotations

import asyncio
import time

from cellplane_operator.clock import SystemClock
from cellplane_operator.domain.ownership import LeaseSettings
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.ownership import LeaseHolder, OwnershipTable
from cellplane_operator.ownership.holder import HolderIdentity
from cellplane_operator.store import EtcdStore

SETTINGS = LeaseSettings(duration_seconds=3, renew_interval_seconds=0.5, margin_seconds=1.0)


class Actor:
    def __init__(self) -> None:
        self.started: list[tuple[int, float]] = []
        self.acting = asyncio.Event()

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        self.started.append((epoch, time.monotonic()))
        self.acting.set()

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        pass

    async def stop_acting(self, epoch: int, reason: str) -> None:
        self.acting.clear()


def holder(table: OwnershipTable, site: str, actor: Actor, *, adopt: bool) -> LeaseHolder:
    return LeaseHolder(table, HolderIdentity("cell-x", "region-a", site), actor, settings=SETTINGS,
                       clock=SystemClock(), adopt_own_lease=adopt)


async def a_holder_that_dies(table: OwnershipTable, stop: asyncio.Event) -> tuple[Actor, float]:
    """site-1 acquires, then its task is cancelled without a release; (its actor, when)."""
    first = Actor()
    task = asyncio.create_task(holder(table, "site-1", first, adopt=False).run(stop))
    await asyncio.wait_for(first.acting.wait(), 10)
    task.cancel()
    return first, time.monotonic()


async def test_only_the_same_identity_adopts_a_live_lease_and_keeps_its_epoch(
        etcd3: LocalControlPlane) -> None:
    store = EtcdStore(etcd3.etcd.endpoints, timeout=2)
    table = OwnershipTable(store)
    stop = asyncio.Event()
    try:
        first, died_at = await a_holder_that_dies(table, stop)

        stranger, successor = Actor(), Actor()
        tasks = [asyncio.create_task(holder(table, "site-2", stranger, adopt=True).run(stop)),
                 asyncio.create_task(holder(table, "site-1", successor, adopt=True).run(stop))]
        await asyncio.wait_for(successor.acting.wait(), 5)
        [(epoch, at)] = successor.started
        assert epoch == first.started[0][0] == 1
        assert at - died_at < SETTINGS.duration_seconds   # long before the lease could end
        await asyncio.sleep(SETTINGS.duration_seconds + SETTINGS.margin_seconds)
        assert stranger.started == []                      # the lease stayed ours throughout
        owner, stored_epoch = await table.read("cell-x")
        assert owner is not None and owner.site == "site-1" and stored_epoch == 1
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await store.close()


async def test_a_lease_that_ran_out_is_not_adopted_but_won_again_under_a_new_epoch(
        etcd3: LocalControlPlane) -> None:
    store = EtcdStore(etcd3.etcd.endpoints, timeout=2)
    table = OwnershipTable(store)
    stop = asyncio.Event()
    try:
        await a_holder_that_dies(table, stop)

        async def owner_gone() -> None:
            while (await table.read("cell-x"))[0] is not None:
                await asyncio.sleep(0.1)

        await asyncio.wait_for(owner_gone(), SETTINGS.duration_seconds + 3)
        successor = Actor()
        task = asyncio.create_task(holder(table, "site-1", successor, adopt=True).run(stop))
        await asyncio.wait_for(successor.acting.wait(), 10)
        assert [epoch for epoch, _ in successor.started] == [2]
        stop.set()
        await task
    finally:
        await store.close()
