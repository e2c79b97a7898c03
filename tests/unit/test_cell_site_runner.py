"""The cell site runner's whole loop (lease, serving, status, takeover, switchover, fencing,
removal) over the fakes of its ports (tests/cellsitefakes.py), without processes;
tests/integration/test_region_loss.py and test_manual_fence.py do the same with real sites
and etcd.

Leases are 3 s with a 1 s margin, so a takeover takes about four seconds of real time.
What is checked holds however slow the machine is: the epoch a site serves under, what
the Cell's status and Events say, and that an owner cut off from etcd ends its database's
writes before its lease ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cellplane_cells.domain.priorities import Floors, Priority
from cellplane_operator.domain.failover import SWITCHOVER_TO
from cellplane_operator.domain.ownership import Role
from cellplane_operator.kube import CELLS
from cellsitefakes import CELL, LEASE, CellWorld, eventually
from regionfakes import condition


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[CellWorld]:
    found = CellWorld(tmp_path)
    try:
        yield found
    finally:
        await found.close()


async def ready_status(world: CellWorld, epoch: int, phase: str = "Ready") -> dict[str, object]:
    async def ready() -> dict[str, object] | None:
        status = await world.status()
        return status if status.get("phase") == phase and status.get("epoch") == epoch else None
    try:
        return await eventually(ready, f"the Cell {phase} under epoch {epoch}")
    except AssertionError as error:
        raise AssertionError(f"{error}; the status: {await world.status()}") from None


async def test_the_home_region_takes_the_lease_serves_under_its_epoch_and_reports_ready(
        world: CellWorld) -> None:
    await world.create_cell()
    # What the placement leader writes into the status: the site's patches leave it be.
    await world.kube.patch(CELLS, CELL, {"status": {"tenants": 3}}, subresource="status")
    home = await world.region("region-a")

    status = await ready_status(world, 1)
    assert status["tenants"] == 3

    site = world.site("region-a")
    assert site is not None and site.serving is not None and site.serving.epoch == 1
    assert world.sites.accepts_writes(home.site, 1)
    assert status["activeRegion"] == "region-a" and status["activeSite"] == home.site.name
    assert status["endpoints"] == {"api": site.endpoints.api, "admin": site.endpoints.admin}
    assert condition(status, "Ready")["status"] == "True"
    group = await world.group()
    assert group.owner is not None and (group.owner.region, group.epoch) == ("region-a", 1)
    report = await world.report("region-a")
    assert report is not None and report.serving and report.epoch == 1
    assert report.endpoints == site.endpoints
    assert await eventually(lambda: world.events("Serving"), "the Serving Event")


async def test_new_priority_floors_on_the_cell_restart_its_workers_under_the_same_epoch(
        world: CellWorld) -> None:
    await world.create_cell()
    await world.region("region-a")
    await ready_status(world, 1)
    site = world.site("region-a")
    assert site is not None and site.serving is not None
    assert site.serving.priority_floors is None  # unset: the workers' default shares

    await world.kube.patch(CELLS, CELL, {"spec": {"capacity": {
        "priorityFloors": {"critical": 4, "low": 1}}}})

    wanted = Floors(20, {Priority.CRITICAL: 4, Priority.HIGH: 0, Priority.DEFAULT: 0,
                         Priority.LOW: 1})

    async def restarted() -> bool:
        found = world.site("region-a")
        return (found is not None and found.serving is not None
                and found.serving.priority_floors == wanted)
    await eventually(restarted, "the workers started with the Cell's floors")
    assert site.serving.epoch == 1 and site.serving.slots_per_worker == 20

    async def said() -> list[dict[str, object]]:
        return [e for e in await world.events("Serving")
                if "floors CRITICAL=4,HIGH=0,DEFAULT=0,LOW=1" in str(e["message"])]
    assert await eventually(said, "the Serving Event with the new floors")


async def test_an_owner_cut_off_from_etcd_stops_its_writes_and_processes_before_its_lease_ends(
        world: CellWorld) -> None:
    await world.create_cell()
    home = await world.region("region-a")
    await ready_status(world, 1)

    home.store.cut = True

    async def stopped() -> bool:
        site = world.site("region-a")
        return site is not None and site.serving is None
    await eventually(stopped, "the cut-off owner to stop serving")
    assert home.runner is not None and home.runner.holder.state.role is Role.FENCED
    assert not world.sites.accepts_writes(home.site, 1)
    # The database stopped taking writes by the grant it was given, whatever the timing of
    # the stop: before the lease that etcd last confirmed ran out (by the margin, less the
    # moment a grant takes to reach the database).
    site = world.site("region-a")
    assert site is not None and site.grant is not None and home.store.last_renewal_sent is not None
    lease_end = home.store.last_renewal_sent + LEASE["durationSeconds"]
    assert site.grant.deadline < lease_end


async def test_a_streaming_standby_takes_over_a_lost_region_under_a_higher_epoch(
        world: CellWorld) -> None:
    await world.create_cell(standby_regions=("region-b",))
    home = await world.region("region-a")
    standby = await world.region("region-b")

    async def standby_streams() -> bool:
        status = await world.status()
        return status.get("phase") == "Ready" and bool(status.get("standbys")) \
            and all(s["streaming"] for s in status["standbys"])  # type: ignore[index]
    await eventually(standby_streams, "the standby to stream, said on the Ready Cell")
    old = world.site("region-a")
    assert old is not None and old.grant is not None
    old_grant_end = old.grant.deadline

    await home.lose()

    # Serving, and degraded: the lost region's site no longer streams as a standby.
    status = await ready_status(world, 2, "Degraded")
    assert condition(status, "Ready")["status"] == "True"
    new = world.site("region-b")
    assert new is not None and new.role == "primary"
    assert new.serving is not None and new.serving.epoch == 2
    assert world.sites.accepts_writes(standby.site, 2)
    assert status["activeRegion"] == "region-b"
    took_over = status["lastTakeover"]
    assert isinstance(took_over, dict)
    assert (took_over["epoch"], took_over["fromRegion"], took_over["toRegion"],
            took_over["planned"]) == (2, "region-a", "region-b", False)
    # The new owner's database took no grant before the old owner's had run out.
    assert new.grant is not None and new.grant.epoch == 2
    assert new.grant.deadline - LEASE["durationSeconds"] >= old_grant_end
    assert await eventually(lambda: world.events("TookOver"), "the TookOver Event")


async def test_a_standby_too_far_behind_is_not_promoted_and_says_why(world: CellWorld) -> None:
    await world.create_cell(standby_regions=("region-b",), max_standby_lag_seconds=5)
    home = await world.region("region-a")
    standby = await world.region("region-b")
    await ready_status(world, 1)
    lagging = world.site("region-b")
    assert lagging is not None
    lagging.lag_seconds = 60.0
    await standby.passes(3)  # the runner has seen the lag while streaming

    await home.lose()

    refused = await eventually(lambda: world.events("FailoverRefused"),
                               "the FailoverRefused Event")
    assert "60.0s behind" in refused[0]["message"]
    status = await world.status()
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "StandbyTooFarBehind")
    assert "endpoints" not in status  # the lost primary's, removed: nobody serves there
    assert status["phase"] == "FailingOver"
    await standby.passes(10)
    assert lagging.role == "standby" and lagging.serving is None
    assert (await world.group()).epoch == 1


async def test_an_old_primary_that_comes_back_after_a_takeover_is_fenced_not_served(
        world: CellWorld) -> None:
    await world.create_cell(standby_regions=("region-b",))
    home = await world.region("region-a")
    await world.region("region-b")
    await ready_status(world, 1)
    await home.lose()
    await ready_status(world, 2, "Degraded")

    world.sites.lost_regions.discard("region-a")
    await world.region("region-a")

    async def fenced() -> bool:
        site = world.site("region-a")
        return site is not None and site.role == "fenced"
    await eventually(fenced, "the old primary to be fenced")
    old = world.site("region-a")
    assert old is not None and old.serving is None and not old.database_up
    assert not world.sites.accepts_writes(old.key, 1)
    assert await eventually(lambda: world.events("OldPrimaryFenced"), "the OldPrimaryFenced Event")
    assert (await world.status())["activeRegion"] == "region-b"


async def test_a_site_of_a_removed_cell_is_destroyed_with_its_report_and_witness(
        world: CellWorld) -> None:
    await world.create_cell(standby_regions=("region-b",))
    await world.region("region-a")
    standby = await world.region("region-b")
    await ready_status(world, 1)
    witness = world.state_dir / "region-b" / "witness" / f"{CELL}@region-b.json"
    await eventually(lambda: _exists(witness), "the standby's witness file")
    assert standby.runner is not None

    await standby.stop()
    await standby.runner.destroy()

    assert world.site("region-b") is None
    assert await world.report("region-b") is None
    assert not witness.exists()
    assert world.site("region-a") is not None  # only this region's site goes


async def _exists(path: Path) -> bool:
    return path.exists()


async def test_a_planned_switchover_hands_the_cell_to_the_standby_under_the_next_epoch(
        world: CellWorld) -> None:
    await world.create_cell(standby_regions=("region-b",))
    home = await world.region("region-a")
    await world.region("region-b")
    await ready_status(world, 1)

    await world.kube.patch(CELLS, CELL, {"metadata": {"annotations": {SWITCHOVER_TO: "region-b"}}})

    async def switched() -> dict[str, object] | None:
        status = await world.status()
        took_over = status.get("lastTakeover")
        return status if isinstance(took_over, dict) and took_over["epoch"] == 2 else None
    status = await eventually(switched, "the switchover to show in the status")
    assert status["activeRegion"] == "region-b"
    took_over = status["lastTakeover"]
    assert isinstance(took_over, dict) and took_over["planned"] is True
    new = world.site("region-b")
    assert new is not None and new.role == "primary" and new.serving is not None
    assert new.serving.epoch == 2
    assert not world.sites.accepts_writes(home.site, 1)
    assert await world.events("SwitchoverHandedOver")

    async def request_removed() -> bool:
        cell = await world.kube.get(CELLS, CELL) or {}
        return SWITCHOVER_TO not in (cell["metadata"].get("annotations") or {})
    await eventually(request_removed, "the switchover request to be removed")


async def test_a_switchover_whose_standby_did_not_replay_the_last_wal_is_given_up(
        world: CellWorld) -> None:
    await world.create_cell(standby_regions=("region-b",))
    home = await world.region("region-a")
    await world.region("region-b")
    await ready_status(world, 1)
    behind = world.site("region-b")
    assert behind is not None
    behind.replay_held = True

    await world.kube.patch(CELLS, CELL, {"metadata": {"annotations": {SWITCHOVER_TO: "region-b"}}})

    aborted = await eventually(lambda: world.events("SwitchoverAborted"),
                               "the SwitchoverAborted Event")
    assert "switchover aborted, region-a serves again under epoch 1" in aborted[0]["message"]

    async def serving_again() -> bool:
        site = world.site("region-a")
        return (site is not None and site.role == "primary" and site.database_up
                and world.sites.accepts_writes(home.site, 1))
    await eventually(serving_again, "region-a to take writes again under epoch 1")
    assert (await world.group()).epoch == 1
    assert behind.role == "standby"
