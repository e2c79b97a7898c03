"""Placement-group ownership on a real 3-member etcd, with injected faults.

Each holder is a real `cellplane ownership hold` process that prints its
transitions as JSON lines with its monotonic clock (CLOCK_MONOTONIC is one
clock for every process of this machine, so the test can order them).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cellfixtures import fetch
from cellplane_cells.migrate import migrate
from cellplane_operator.domain.ownership import OwnerRecord
from cellplane_operator.localplane import LocalControlPlane, ManagedProcess
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.ownership.table import OwnershipTable
from cellplane_operator.store import EtcdStore

LEASE, RENEW, MARGIN = 3, 0.5, 1.0
CELL = "cell-a"


class Holder:
    def __init__(self, plane: LocalControlPlane, region: str, *, endpoints: list[str] | None = None,
                 lease: int = LEASE, renew: float = RENEW, margin: float = MARGIN,
                 database: str | None = None) -> None:
        self.region = region
        self.log = plane.run_dir / "logs" / f"holder-{region}.log"
        self.process = ManagedProcess(
            f"holder-{region}",
            [sys.executable, "-m", "cellplane_operator", "ownership", "hold", "--cell", CELL,
             "--region", region, "--site", f"{region}-1",
             "--etcd", ",".join(endpoints or plane.etcd.endpoints),
             "--lease-seconds", str(lease), "--renew-seconds", str(renew),
             "--margin-seconds", str(margin), "--etcd-timeout-seconds", "0.5",
             *(["--database", database] if database else [])],
            log=self.log)
        self.process.start()

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            if line.startswith('{"event"'):
                event = json.loads(line)
                if kind is None or event["event"] == kind:
                    found.append(event)
        return found

    async def wait(self, kind: str, *, timeout: float = 30) -> dict[str, Any]:
        # In a thread: the event loop keeps serving the test's etcd watch meanwhile.
        await asyncio.to_thread(self.process.wait_until, lambda: bool(self.events(kind)),
                                timeout=timeout, what=f"a {kind!r} event")
        return self.events(kind)[0]


@pytest.fixture
def holders(etcd3: LocalControlPlane) -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.process.stop()


class KeyWatch:
    """Timestamps (monotonic) every change of the owner key, seen from the given members."""

    def __init__(self, endpoints: list[str]) -> None:
        self.store = EtcdStore(endpoints, timeout=2)
        self.table = OwnershipTable(self.store)
        self.changes: list[tuple[float, str, bytes]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KeyWatch:
        async def run() -> None:
            async for event in self.store.watch_prefix(self.table.owner_key(CELL)):
                self.changes.append((time.monotonic(), event.kind, event.value))
        self._task = asyncio.create_task(run())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await self.store.close()

    def deleted_at(self) -> float | None:
        return next((at for at, kind, _ in self.changes if kind == "delete"), None)


async def until(condition: Any, *, timeout: float, what: str) -> None:
    await asyncio.to_thread(wait_for, condition, timeout=timeout, what=what)


async def test_watch_reports_puts_and_deletes_as_our_kinds(etcd3: LocalControlPlane) -> None:
    store = EtcdStore(etcd3.etcd.endpoints, timeout=2)
    seen: list[tuple[str, str]] = []

    async def watch_from(revision: int) -> None:
        async for event in store.watch_prefix("/cellplane/test/", start_revision=revision):
            seen.append((event.kind, event.key))

    # Watching from a revision taken before the writes: no event can slip
    # past, however late the watch registers.
    start = await store.put("/cellplane/test/start", b"")
    task = asyncio.create_task(watch_from(start + 1))
    try:
        await store.put("/cellplane/test/a", b"1")
        await store.delete("/cellplane/test/a")
        await until(lambda: len(seen) >= 2, timeout=10, what="two watch events")
        assert seen[:2] == [("put", "/cellplane/test/a"), ("delete", "/cellplane/test/a")]
    finally:
        task.cancel()
        await store.close()


async def test_killed_owner_is_replaced_only_after_its_lease_ended_plus_the_margin(
    etcd3: LocalControlPlane, holders: list[Holder]
) -> None:
    async with KeyWatch(etcd3.etcd.endpoints) as watch:
        owner = Holder(etcd3, "region-a")
        holders.append(owner)
        first = await owner.wait("acting")
        candidate = Holder(etcd3, "region-b")
        holders.append(candidate)
        await until(lambda: len(owner.events("renewed")) >= 3, timeout=20, what="renewals")

        killed_at = time.monotonic()
        owner.process.kill()
        taken = await candidate.wait("acting", timeout=30)

        deleted_at = watch.deleted_at()
        assert deleted_at is not None
        last_renewal = owner.events("renewed")[-1]["monotonic"]
        # etcd held the key for a full lease after the last renewal it saw...
        assert deleted_at - last_renewal >= LEASE - RENEW - 0.05
        # ...and the candidate waited the margin after it saw the key gone: its own
        # reading, not this test's watch, which may deliver the deletion later on a busy
        # machine (0.994 s against the 1.0 s margin, issue #18).
        assert taken["vacated_at"] is not None
        assert taken["monotonic"] - taken["vacated_at"] >= MARGIN
        assert taken["vacated_at"] >= last_renewal
        assert taken["monotonic"] - killed_at >= LEASE - RENEW + MARGIN - 0.05
        assert taken["epoch"] == first["epoch"] + 1
    owner_record, epoch = await OwnershipTable(EtcdStore(etcd3.etcd.endpoints)).read(CELL)
    assert owner_record is not None and owner_record.region == "region-b" and epoch == taken["epoch"]


async def test_leader_loss_during_renewals_does_not_cost_ownership(
    etcd3: LocalControlPlane, holders: list[Holder]
) -> None:
    # A lease with room for an election: fence at last renewal + 4 s.
    owner = Holder(etcd3, "region-a", lease=6, renew=1.0, margin=2.0)
    holders.append(owner)
    first = await owner.wait("acting")
    leader = etcd3.etcd.leader()
    assert leader is not None
    etcd3.etcd.kill(leader)
    renewals_before = len(owner.events("renewed"))
    await until(lambda: len(owner.events("renewed")) >= renewals_before + 4, timeout=30,
                what="renewals to go on after the leader was killed")
    assert owner.events("stopped") == []
    record, epoch = await OwnershipTable(EtcdStore(
        [m.endpoint for m in etcd3.etcd.members if m.name != leader])).read(CELL)
    assert record is not None and record.epoch == first["epoch"] == epoch


async def test_owner_cut_off_from_etcd_self_fences_before_its_lease_ends(
    etcd3: LocalControlPlane, holders: list[Holder]
) -> None:
    only = etcd3.etcd.member("region-a")
    others = [m.endpoint for m in etcd3.etcd.members if m.name != "region-a"]
    async with KeyWatch(others) as watch:
        owner = Holder(etcd3, "region-a", endpoints=[only.endpoint])
        holders.append(owner)
        await owner.wait("acting")
        await until(lambda: len(owner.events("renewed")) >= 2, timeout=20, what="renewals")
        etcd3.etcd.pause("region-a")       # the owner's only member hangs: a partition
        try:
            stopped = await owner.wait("stopped", timeout=30)
            await until(lambda: watch.deleted_at() is not None, timeout=30,
                        what="etcd to expire the cut-off owner's key")
        finally:
            etcd3.etcd.resume("region-a")
    last_renewal = owner.events("renewed")[-1]["monotonic"]
    deleted_at = watch.deleted_at()
    assert deleted_at is not None
    assert "self-fenced" in stopped["reason"]
    # It stopped by its own clock, margin before the lease could end, and
    # well before etcd actually expired the key.
    assert stopped["monotonic"] <= last_renewal + LEASE - MARGIN + 0.1
    assert deleted_at - stopped["monotonic"] >= MARGIN - 0.1


async def test_without_quorum_the_owner_self_fences_and_nobody_acquires(
    etcd3: LocalControlPlane, holders: list[Holder]
) -> None:
    owner = Holder(etcd3, "region-a")
    holders.append(owner)
    await owner.wait("acting")
    candidate = Holder(etcd3, "region-b")
    holders.append(candidate)
    await until(lambda: len(owner.events("renewed")) >= 2, timeout=20, what="renewals")
    etcd3.etcd.kill("region-b")
    etcd3.etcd.kill("region-c")
    stopped = await owner.wait("stopped", timeout=30)
    assert "self-fenced" in stopped["reason"]
    # Long enough for a lease and a margin to pass twice: still nobody acts.
    await asyncio.sleep(2 * (LEASE + MARGIN))
    assert candidate.events("acting") == []
    assert len(owner.events("acting")) == 1


async def test_a_paused_owner_s_database_stops_by_itself_and_the_new_owner_keeps_it(
    etcd3: LocalControlPlane, holders: list[Holder]
) -> None:
    """SIGSTOP the owner: nobody tells its database anything, yet it refuses writes
    once the last granted duration has run out; the new owner's grant then wins,
    and the old owner, resumed, cannot take the database back."""
    pg = etcd3.add_postgres("cell")
    conninfo = pg.dsn_for("postgres")
    migrate(conninfo, cell=CELL)
    owner = Holder(etcd3, "region-a", database=conninfo)
    holders.append(owner)
    acting = await owner.wait("acting")
    await until(lambda: len(owner.events("renewed")) >= 2, timeout=20, what="renewals")
    [(epoch, remaining)] = fetch(conninfo, "SELECT epoch, extract(epoch FROM lease_deadline - clock_timestamp())"
                                           " FROM placement_group")
    assert epoch == acting["epoch"] and 0 < float(remaining) <= LEASE - MARGIN

    owner.process.pause()
    await until(lambda: fetch(conninfo, "SELECT clock_timestamp() >= lease_deadline FROM placement_group")
                == [(True,)], timeout=LEASE + 2, what="the paused owner's grant to run out")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(epoch),))
        with pytest.raises(psycopg.errors.DatabaseError, match="lease expired"):
            conn.execute("INSERT INTO tenants (tenant_id, plan, max_running_jobs, jobs_per_second, burst,"
                         " signing_secret) VALUES ('late', 'pro', 1, 1, 1, 's')")

    successor = Holder(etcd3, "region-b", database=conninfo)
    holders.append(successor)
    taken = await successor.wait("acting", timeout=30)
    owner.process.resume()
    await owner.wait("stopped", timeout=30)
    await until(lambda: len(successor.events("renewed")) >= 2, timeout=20, what="successor renewals")
    assert fetch(conninfo, "SELECT epoch, lease_deadline > clock_timestamp() FROM placement_group") == [
        (taken["epoch"], True)]


async def test_a_clean_shutdown_hands_over_without_waiting_for_the_lease(
    etcd3: LocalControlPlane, holders: list[Holder]
) -> None:
    owner = Holder(etcd3, "region-a", lease=10, renew=1.0, margin=1.0)
    holders.append(owner)
    first = await owner.wait("acting")
    successor = Holder(etcd3, "region-b", lease=10, renew=1.0, margin=1.0)
    holders.append(successor)
    await until(lambda: len(owner.events("renewed")) >= 2, timeout=20, what="renewals")
    stopped_at = time.monotonic()
    owner.process.stop()                         # SIGTERM: stop acting, then release
    taken = await successor.wait("acting", timeout=30)
    assert owner.events("stopped")[0]["monotonic"] <= taken["monotonic"]
    # Margin after the release, far less than the 10 s lease it held.
    assert MARGIN - 0.05 <= taken["monotonic"] - stopped_at < 10 - 1.0
    assert taken["epoch"] == first["epoch"] + 1


async def test_release_deletes_the_owner_key_only_for_its_holder(etcd3: LocalControlPlane) -> None:
    store = EtcdStore(etcd3.etcd.endpoints, timeout=2)
    table = OwnershipTable(store)
    try:
        lease_id, _ = await store.grant_lease(10)
        mine = await table.try_acquire("handover", region="region-a", site="a1", expected_epoch=0,
                                       lease_id=lease_id)
        assert mine is not None and mine.epoch == 1
        assert await table.try_acquire("handover", region="region-b", site="b1", expected_epoch=0,
                                       lease_id=lease_id) is None
        impostor = OwnerRecord("region-b", "b1", mine.epoch, lease_id)
        assert not await table.release("handover", impostor)
        assert await table.release("handover", mine)
        assert await table.read("handover") == (None, 1)
        # The epoch key stays: the next owner runs under epoch 2, never 1 again.
        second = await table.try_acquire("handover", region="region-b", site="b1",
                                         expected_epoch=0, lease_id=lease_id)
        assert second is None
        second = await table.try_acquire("handover", region="region-b", site="b1",
                                         expected_epoch=1, lease_id=lease_id)
        assert second is not None and second.epoch == 2
    finally:
        await store.close()
