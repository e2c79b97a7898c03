"""Two regional operators over one apiserver and one etcd: standbys, HOME_ASYNC, the election.

region-a's operator runs the primary sites of region-a's cells; region-b's runs
their standby sites. One of the two, whichever holds the election, places
tenants; when it dies, the other takes over placement.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cellplane_operator.domain.ownership import OwnerRecord
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.ownership.election import ELECTIONS_PREFIX
from regionplane import RegionPlane, cell, condition, etcd, ready, tenant

REGIONS = ("region-a", "region-b")


@pytest.fixture(scope="module")
def plane(kube: LocalControlPlane) -> Iterator[RegionPlane]:
    regions = RegionPlane(kube, REGIONS)
    for region in REGIONS:
        regions.start_operator(region)
    try:
        yield regions
    finally:
        regions.close()


def leader(plane: RegionPlane) -> str | None:
    found = etcd(plane, lambda store: store.get(f"{ELECTIONS_PREFIX}placement/owner"))
    return None if found is None else OwnerRecord.decode(found.value).region


def test_a_cell_with_a_standby_is_ready_once_the_standby_streams(plane: RegionPlane) -> None:
    plane.apply(cell("ha-a1", standbyRegions=["region-b"]))
    status = plane.await_status("cell", "ha-a1", ready, timeout=150)
    [standby] = status["standbys"]
    assert standby["region"] == "region-b" and standby["streaming"] is True
    assert standby["lagSeconds"] < 30
    assert condition(status, "Degraded")["status"] == "False"
    # The standby really is a copy: the primary's schema is there, read-only.
    assert (plane.state_dir("region-b") / "ha-a1@region-b" / "pgdata" / "standby.signal").exists()


def test_home_async_tenants_go_only_to_cells_with_a_standby(plane: RegionPlane) -> None:
    ns = plane.namespace("async")
    plane.apply(cell("single-a1"))
    plane.await_status("cell", "single-a1", ready, timeout=120)
    plane.apply(cell("ha-a2", standbyRegions=["region-b"]))
    plane.await_status("cell", "ha-a2", ready, timeout=150)
    plane.apply(tenant("careful", ns, regionPolicy="HOME_ASYNC"))
    status = plane.await_status("tenant", "careful", ready, namespace=ns)
    assert status["cell"] in ("ha-a1", "ha-a2")


def test_a_dedicated_home_async_tenant_gets_a_cell_with_a_standby_in_the_next_region(
        plane: RegionPlane) -> None:
    ns = plane.namespace("async-dedicated")
    plane.apply(tenant("vip", ns, plan="enterprise", isolation="dedicated",
                       regionPolicy="HOME_ASYNC"))
    status = plane.await_status("tenant", "vip", ready, namespace=ns, timeout=180)
    owned = plane.get("cell", status["cell"])
    assert owned is not None and owned["spec"]["standbyRegions"] == ["region-b"]
    assert owned["status"]["standbys"][0]["streaming"] is True


def test_when_the_placement_leader_dies_the_other_operator_places(plane: RegionPlane) -> None:
    ns = plane.namespace("election")
    for region in REGIONS:
        plane.apply(cell(f"elect-{region}", region))
        plane.await_status("cell", f"elect-{region}", ready, timeout=120)
    first = leader(plane)
    assert first in REGIONS
    survivor = next(r for r in REGIONS if r != first)
    plane.operators[first].kill()
    # A tenant of the surviving region: its cell keeps an owner while the other
    # region's operator is down.
    plane.apply(tenant("orphan", ns, region=survivor))
    status = plane.await_status("tenant", "orphan", ready, namespace=ns, timeout=120)
    assert status["cell"] == f"elect-{survivor}"
    assert leader(plane) == survivor
    events = json.loads(plane.kube.kubectl("get", "events", "-n", ns, "-o", "json").stdout)
    placed = [e for e in events["items"] if e["reason"] == "Placed"]
    assert [e["source"]["component"] for e in placed] == [f"cellplane-operator/{survivor}"]
    plane.start_operator(first, log_suffix="-restarted")
