"""The regional operator killed in the middle of its work, and restarted.

A failpoint makes the operator exit abruptly (``os._exit``, as a SIGKILL would)
right after one step of a tenant's placement; the restarted operator must
finish the placement from the state left behind, never place twice. And a
restarted operator adopts the sites its predecessor started instead of
starting second copies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from cellplane_operator.failpoints import EXIT_CODE
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.placement.records import TenantKey
from regionplane import RegionPlane, tenant
from regionplane import cell_database, cell_processes, db_rows, ready, ready_cell, records


@pytest.fixture(scope="module")
def plane(kube: LocalControlPlane) -> Iterator[RegionPlane]:
    regions = RegionPlane(kube)
    regions.start_operator("region-a")
    try:
        # The product's lease (10 s, renewals every 2 s, margin 2 s): the database
        # grant then outlasts an operator restart, as it does in production; with the
        # tests' 2 s lease a slow restart would let the grant run out first, and the
        # cell's workers would stop on refused writes (and be restarted) before the
        # new operator adopted them.
        for name in ("crash-a1", "crash-a2"):
            ready_cell(regions, name, lease={"durationSeconds": 10, "renewIntervalSeconds": 2,
                                             "marginSeconds": 2})
        yield regions
    finally:
        regions.close()


def restart(plane: RegionPlane, *, failpoint: str | None = None) -> None:
    plane.operators["region-a"].stop()
    env = {"CELLPLANE_FAILPOINTS": failpoint} if failpoint else None
    plane.start_operator("region-a", env=env,
                         log_suffix=f"-{failpoint.partition('@')[0]}" if failpoint else "")


def placed_events(plane: RegionPlane, namespace: str, name: str) -> list[str]:
    events = json.loads(plane.kube.kubectl("get", "events", "-n", namespace, "--field-selector",
                                           f"involvedObject.name={name}", "-o", "json").stdout)
    return [e["message"] for e in events["items"] if e["reason"] == "Placed"]


@pytest.mark.parametrize("point", ["tenant-after-record", "tenant-after-secret",
                                   "tenant-after-provision"])
def test_killed_between_placement_steps_the_tenant_is_placed_exactly_once(
        plane: RegionPlane, point: str) -> None:
    ns = plane.namespace(point)
    restart(plane, failpoint=f"{point}@{ns}/crashy")
    plane.apply(tenant("crashy", ns, plan="pro"))
    crashed = plane.operators["region-a"]
    wait_for(lambda: crashed.returncode is not None, timeout=90,
             what=f"the operator to die at failpoint {point}")
    assert crashed.returncode == EXIT_CODE, crashed.returncode
    at_crash = records(plane)[TenantKey(ns, "crashy")]

    restart(plane)
    status = plane.await_status("tenant", "crashy", ready, namespace=ns, timeout=120)
    after = records(plane)[TenantKey(ns, "crashy")]
    # The decision written before the crash was kept; only the key's digest is added,
    # once the cell holds the key (the router checks keys with it).
    assert replace(after, key_digest=None) == replace(at_crash, key_digest=None)
    assert at_crash.key_digest is None and after.key_digest is not None
    assert (status["cell"], status["epoch"]) == (at_crash.cell, 1)
    holding = [name for name in ("crash-a1", "crash-a2")
               if db_rows(cell_database(plane, name),
                          "SELECT 1 FROM tenants WHERE tenant_id = %s", status["tenantId"])]
    assert holding == [at_crash.cell]
    # One decision, announced at most once (a crash right after the record can cost the
    # announcement, never add a second one).
    assert len(placed_events(plane, ns, "crashy")) == (0 if point == "tenant-after-record" else 1)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_restarted_operator_adopts_its_sites_and_their_lease(plane: RegionPlane, how: str) -> None:
    before = plane.await_status("cell", "crash-a1", ready)
    processes = cell_processes("crash-a1")
    assert len(processes["postgres"]) == 1 and len(processes["serve"]) == 1, processes
    assert len(processes["work"]) >= 1

    operator = plane.operators["region-a"]
    operator.kill() if how == "SIGKILL" else operator.stop()
    plane.start_operator("region-a", log_suffix=f"-after-{how}")
    log = plane.kube.run_dir / "logs" / f"operator-region-a-after-{how}.log"
    wait_for(lambda: "crash-a1: adopted the live lease of epoch" in log.read_text(), timeout=60,
             what="the new operator to adopt the cell's lease")
    after = plane.await_status("cell", "crash-a1", ready)
    # Same epoch, same processes: the cell never stopped for the operator's restart.
    assert after["epoch"] == before["epoch"]
    assert cell_processes("crash-a1") == processes
    assert after["endpoints"] == before["endpoints"]


def test_a_second_operator_on_the_same_state_directory_refuses_to_start(plane: RegionPlane) -> None:
    second = plane.start_operator("region-a", log_suffix="-second", register=False)
    wait_for(lambda: second.returncode is not None, timeout=60, what="the second operator to exit")
    assert second.returncode == 1
    assert "another operator runs on" in second.log.read_text()
