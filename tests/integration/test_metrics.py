"""The operator's, the router's and a cell's /metrics, scraped from real processes.

One operator (region-a) serving /metrics on a free port, a router as its own
process, cells it provisioned. Every wait polls a scrape until the value
shows, with a timeout; nothing sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.responses import JSONResponse
from starlette.responses import Response

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey
from cellplane_operator.sites.base import SiteEndpoints
from cellplane_operator.sites.reports import SiteReport, SiteReports
from cellplane_operator.store import EtcdStore

from httpservers import Call, RecordingServer
from metricscrape import Samples, await_metric, scrape, value
from regionplane import RegionPlane, etcd, ready, ready_cell, secret_data, tenant

CELL = "metrics-a1"
OTHER_CELL = "metrics-a2"
OWNED = {"kind": "cell", "group": CELL, "region": "region-a"}
HOLD_SECONDS = 1.5


@pytest.fixture(scope="module")
def plane(kube: LocalControlPlane) -> Iterator[RegionPlane]:
    regions = RegionPlane(kube)
    regions.start_operator("region-a", metrics=True)
    try:
        yield regions
    finally:
        regions.close()


@pytest.fixture(scope="module")
def router(plane: RegionPlane) -> Iterator[str]:
    process, url = plane.start_router(plane.kube.etcd.endpoints, hold_seconds=HOLD_SECONDS,
                                      metrics=True)
    try:
        yield url
    finally:
        process.stop()


@dataclass(frozen=True)
class Placed:
    namespace: str
    tenant_id: str
    headers: dict[str, str]


@pytest.fixture(scope="module")
def placed(plane: RegionPlane, target: RecordingServer) -> Placed:
    """A Ready cell and a tenant in it whose bucket holds two submissions (pro: no credit)."""
    ready_cell(plane, CELL)
    namespace = plane.namespace("metrics")
    plane.apply(tenant("quota", namespace, plan="pro", cell=CELL,
                       quotas={"jobsPerSecond": 0.01, "burst": 2},
                       targets=[{"name": "default", "url": f"{target.url}/run"}]))
    status = plane.await_status("tenant", "quota", ready, namespace=namespace, timeout=120)
    key = (secret_data(plane, namespace, "quota-api-key") or {})["api-key"]
    return Placed(namespace, str(status["tenantId"]), {"Authorization": f"Bearer {key}"})


def test_the_operator_reports_ownership_epoch_and_lease_renewals(
        plane: RegionPlane, placed: Placed) -> None:
    url = plane.metrics["region-a"]
    samples = await_metric(url, "cellplane_operator_group_owned", lambda v: v == 1, **OWNED)
    epoch = value(samples, "cellplane_operator_group_epoch", **OWNED)
    assert epoch is not None and epoch >= 1
    cell = plane.get("cell", CELL)
    assert cell is not None and epoch == cell["status"]["epoch"]
    # The only operator leads the placement election too.
    assert value(samples, "cellplane_operator_group_owned", kind="election", group="placement",
                 region="region-a") == 1
    await_metric(url, "cellplane_operator_lease_renew_seconds_count", lambda v: v > 0,
                 kind="cell")
    # Placing the tenant was one applied compare-and-swap.
    assert (value(samples, "cellplane_operator_placement_writes_total", operation="place",
                  result="applied") or 0) >= 1


def test_the_router_counts_requests_and_passes_a_tenants_429_and_402_through(
        plane: RegionPlane, router: str, placed: Placed) -> None:
    metrics = plane.metrics["router"]
    # Not on the port tenants call: the per-tenant counters name tenants.
    assert httpx.get(f"{router}/metrics", timeout=10).status_code == 404

    def submit(n: int, estimate: int) -> int:
        return httpx.post(f"{router}/v1/jobs", timeout=10,
                          json={"target": "default", "payload": {"n": n}, "estimate": estimate},
                          headers={**placed.headers, "Idempotency-Key": f"metrics-{n}"}
                          ).status_code

    assert submit(1, estimate=0) == 202
    assert submit(2, estimate=1) == 402  # a pro tenant's wallet starts empty
    assert submit(3, estimate=0) == 429  # the bucket held two
    assert httpx.get(f"{router}/v1/jobs", timeout=10).status_code == 401

    samples = scrape(metrics)
    for code in ("429", "402"):
        assert value(samples, "cellplane_router_tenant_refusals_total",
                     tenant=placed.tenant_id, code=code) == 1, code
    assert (value(samples, "cellplane_router_requests_total", code_class="2xx",
                  outcome="forwarded") or 0) >= 1
    assert (value(samples, "cellplane_router_requests_total", code_class="4xx",
                  outcome="forwarded") or 0) >= 1
    assert (value(samples, "cellplane_router_requests_total", code_class="4xx",
                  outcome="unauthenticated") or 0) >= 1
    assert value(samples, "cellplane_router_held_requests") == 0


async def _frozen(call: Call) -> Response:
    """A site that no longer serves the tenant (frozen for a move's cutover)."""
    return JSONResponse({"error": {"code": "tenant_moving", "message": "frozen for a move"}},
                        status_code=503)


def test_the_router_counts_held_requests_and_stale_route_retries(
        plane: RegionPlane, router: str) -> None:
    metrics = plane.metrics["router"]
    before = scrape(metrics)

    def grew(samples: Samples, name: str, **labels: str) -> float:
        return (value(samples, name, **labels) or 0) - (value(before, name, **labels) or 0)

    def once_routed(key: str) -> httpx.Response:
        """The answer to the first request after the router's watch has the tenant (until
        then it is an unknown tenant's 401, at once)."""
        answers: list[httpx.Response] = []

        def known() -> bool:
            answers.append(httpx.get(f"{router}/v1/jobs", timeout=10,
                                     headers={"Authorization": f"Bearer {key}"}))
            return answers[-1].status_code != 401

        wait_for(known, timeout=10, what=f"the router to route {key}")
        return answers[-1]

    # A tenant of a cell nobody owns (as between a lease's end and a takeover): held, then 503.
    ownerless = PlacementRecord(cell="metrics-ownerless", epoch=1, tenant_id="metrics-limbo",
                                uid="u", max_running_jobs=1)
    etcd(plane, lambda store: PlacementRecords(store).create(
        TenantKey("metrics", "limbo"), ownerless, guard=[]))
    held = once_routed("cpk_metrics-limbo.s")
    assert held.status_code == 503 and held.json()["error"]["code"] == "cell_unavailable"

    # A tenant whose site refuses it as frozen: asked again once, then the refusal passed on.
    with RecordingServer(respond=_frozen) as site:
        report = SiteReport(role="primary", site="metrics-frozen@region-a", serving=True,
                            epoch=1, endpoints=SiteEndpoints(api=site.url, admin=site.url))
        frozen = PlacementRecord(cell="metrics-frozen", epoch=1, tenant_id="metrics-frozen",
                                 uid="u", max_running_jobs=1)

        async def place(store: EtcdStore) -> None:
            await store.put("/cellplane/groups/metrics-frozen/owner", json.dumps(
                {"region": "region-a", "site": "metrics-frozen@region-a", "epoch": 1,
                 "lease_id": 1}).encode())
            await SiteReports(store).publish("metrics-frozen", "region-a", report)
            assert await PlacementRecords(store).create(TenantKey("metrics", "frozen"), frozen,
                                                        guard=[])

        etcd(plane, place)
        refused = once_routed("cpk_metrics-frozen.s")
        assert refused.status_code == 503 and len(site.snapshot()) == 2

    samples = scrape(metrics)
    assert grew(samples, "cellplane_router_holds_total", reason="NoOwner") == 1
    assert grew(samples, "cellplane_router_hold_seconds_count", outcome="timed_out") == 1
    hold = grew(samples, "cellplane_router_hold_seconds_sum", outcome="timed_out")
    assert HOLD_SECONDS <= hold < HOLD_SECONDS + 1
    assert grew(samples, "cellplane_router_requests_total", code_class="5xx",
                outcome="hold_timeout") == 1
    assert grew(samples, "cellplane_router_stale_route_retries_total", reason="tenant_moving") == 1
    assert grew(samples, "cellplane_router_requests_total", code_class="5xx",
                outcome="forwarded") == 1
    assert value(samples, "cellplane_router_held_requests") == 0


def test_the_cell_reports_queue_slots_and_the_tenants_refusals(
        plane: RegionPlane, router: str, placed: Placed) -> None:
    cell = plane.get("cell", CELL)
    assert cell is not None
    admin = cell["status"]["endpoints"]["admin"]
    token = (secret_data(plane, "cellplane-system", f"cell-{CELL}-admin") or {})["token"]
    headers = {"Authorization": f"Bearer {token}"}
    # The 429 and 402 of the router test were the cell's own answers, counted there per tenant.
    samples = await_metric(f"{admin}/metrics", "cellplane_cell_tenant_refusals_total",
                           lambda v: v >= 1, headers=headers, tenant=placed.tenant_id,
                           reason="rate_limited")
    assert value(samples, "cellplane_cell_tenant_refusals_total", tenant=placed.tenant_id,
                 reason="insufficient_funds") == 1
    for name in ("cellplane_cell_queue_age_seconds", "cellplane_cell_queued_jobs",
                 "cellplane_cell_running_jobs"):
        assert value(samples, name, tenant=placed.tenant_id) is not None, name
    assert value(samples, "cellplane_cell_running_cap", tenant=placed.tenant_id) == 5  # pro
    assert (value(samples, "cellplane_cell_submissions_refused_total",
                  reason="rate_limited") or 0) >= 1


def test_a_move_counts_its_phases_and_its_write_pause(plane: RegionPlane, placed: Placed) -> None:
    url = plane.metrics["region-a"]
    ready_cell(plane, OTHER_CELL)
    plane.apply({"apiVersion": "cellplane.io/v1alpha1", "kind": "TenantMove",
                 "metadata": {"name": "quota-to-a2", "namespace": placed.namespace},
                 "spec": {"tenant": "quota", "targetCell": OTHER_CELL}})
    status = plane.await_status("tenantmove", "quota-to-a2",
                                lambda s: s.get("phase") in ("Completed", "Failed", "Aborted"),
                                namespace=placed.namespace, timeout=180)
    assert status["phase"] == "Completed", status
    samples = await_metric(url, "cellplane_operator_moves", lambda v: v == 1, phase="Completed")
    assert value(samples, "cellplane_operator_moves", phase="Copying") == 0
    for phase in ("Copying", "CatchingUp", "CuttingOver", "Verifying", "Completed"):
        assert (value(samples, "cellplane_operator_move_phase_transitions_total",
                      phase=phase) or 0) >= 1, phase
    assert value(samples, "cellplane_operator_move_write_pause_seconds_count") == 1
    pause = value(samples, "cellplane_operator_move_write_pause_seconds_sum")
    assert pause is not None and abs(pause - status["progress"]["pauseSeconds"]) < 0.01


def test_an_owner_cut_off_from_etcd_counts_its_self_fence_and_takes_the_cell_back(
        plane: RegionPlane, placed: Placed) -> None:
    """Last in the module: etcd (the only member) answers nothing for a while."""
    url = plane.metrics["region-a"]
    before = await_metric(url, "cellplane_operator_group_owned", lambda v: v == 1, **OWNED)
    epoch = value(before, "cellplane_operator_group_epoch", **OWNED)
    assert epoch is not None

    def fences(samples: Samples) -> float:
        return sum(value(samples, "cellplane_operator_self_fences_total", **OWNED, reason=reason)
                   or 0 for reason in ("etcd_unreachable", "renewal_late"))

    member = plane.kube.etcd.members[0].name
    plane.kube.etcd.pause(member)
    try:
        # The metrics server does not wait on etcd or on kopf's loop: it answers meanwhile.
        wait_for(lambda: fences(scrape(url)) >= fences(before) + 1, timeout=30, interval=0.2,
                 what="the holder of the cut-off owner to count a self-fence")
        assert value(scrape(url), "cellplane_operator_group_owned", **OWNED) == 0
    finally:
        plane.kube.etcd.resume(member)
    # etcd back: the same region wins the group again, under a higher epoch.
    await_metric(url, "cellplane_operator_group_epoch", lambda v: v > epoch, timeout=90, **OWNED)
    await_metric(url, "cellplane_operator_group_owned", lambda v: v == 1, timeout=90, **OWNED)
