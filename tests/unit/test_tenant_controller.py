"""The TenantController's whole loop (election, watch, placement, Secret, cell, status,
Events, removal) over the fakes of every port, wired as runtime/region.py wires it
(tests/regionfakes.py). tests/integration/test_placement.py runs the same flow on the
real apiserver, etcd and cells.

Every wait is for a condition, never a fixed time; the election's lease is 2 s, and the
controller's retries back off from 1 s, so a test takes a few seconds at most.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from cellplane_operator.domain.routing import key_digest
from cellplane_operator.kube import SECRETS, TENANTS
from cellplane_operator.placement.records import TenantKey
from regionfakes import Plane, condition, eventually

NS = "team"
TARGET = "http://127.0.0.1:8080/run"
HOOK = "http://127.0.0.1:8081/hook"
PRIVATE = "http://10.20.30.40/run"
"""Refused by a cell that does not allow private targets (production's policy)."""


async def status_where(plane: Plane, name: str, what: str, test: Any) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await plane.tenant_status(name, NS)
        return status if test(status) else None
    return await eventually(probe, f"tenant {name}: {what}")


def ready(status: dict[str, Any]) -> bool:
    return status.get("phase") == "Ready"


async def secret_data(plane: Plane, name: str) -> dict[str, str] | None:
    found = await plane.kube.get(SECRETS, name, namespace=NS)
    if found is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in found["data"].items()}


async def test_a_tenant_in_a_ready_shared_cell_is_placed_keyed_and_provisioned(plane: Plane) -> None:
    cell = await plane.ready_cell("a1")
    await plane.operator()
    await plane.create_tenant("acme", NS, targets=[{"name": "default", "url": TARGET}],
                              webhooks=[{"url": HOOK, "maxConcurrency": 3}])

    status = await status_where(plane, "acme", "Ready", ready)
    assert (status["cell"], status["epoch"], status["apiKeySecret"]) == ("a1", 1, "acme-api-key")
    assert condition(status, "Placed")["status"] == "True"
    assert status["apiEndpoint"] == "http://a1.cells.test:9000"
    assert status["quotas"]["maxRunningJobs"] == 5 and status["observedGeneration"] == 1
    tenant = await plane.tenant("acme", NS)
    assert tenant is not None and tenant["metadata"]["finalizers"] == ["cellplane.io/placement"]

    key = await secret_data(plane, "acme-api-key")
    assert key is not None and key["api-key"].startswith("cpk_")
    assert key["tenant-id"] == status["tenantId"]
    # The record is what the router routes by: it carries the key's digest only once
    # the cell holds the key.
    record = (await plane.records())[TenantKey(NS, "acme")]
    assert (record.cell, record.epoch, record.tenant_id, record.max_running_jobs) == (
        "a1", 1, status["tenantId"], 5)
    assert record.key_digest == key_digest(key["api-key"])

    # The cell was told, with the admin token from the cell's Secret (the fake checks it).
    placed = cell.tenants[status["tenantId"]]
    assert (placed.plan, placed.api_key, placed.active) == ("pro", key["api-key"], True)
    assert placed.targets == {"default": TARGET}
    assert placed.webhooks == {HOOK: (key["webhook-secret"], 3)}

    async def load_published() -> dict[str, Any] | None:
        found = await plane.cell_status("a1")
        return found if found.get("tenants") == 1 else None
    assert (await eventually(load_published, "cell a1 to count its tenant"))["slotsInUse"] == 5


async def test_a_quota_change_reaches_the_cell_and_the_record(plane: Plane) -> None:
    cell = await plane.ready_cell("a1")
    await plane.operator()
    await plane.create_tenant("tuned", NS)
    tenant_id = (await status_where(plane, "tuned", "Ready", ready))["tenantId"]

    await plane.kube.patch(TENANTS, "tuned", {"spec": {"quotas": {
        "maxRunningJobs": 9, "burst": 40, "strictSchedules": 3}}}, namespace=NS)
    status = await status_where(plane, "tuned", "generation 2 applied",
                                lambda s: s.get("observedGeneration") == 2 and ready(s))
    assert (status["quotas"]["maxRunningJobs"], status["quotas"]["strictSchedules"]) == (9, 3)
    # The cell's names: one name per quota from the CRD to the column.
    assert cell.tenants[tenant_id].quotas == {"max_running_jobs": 9, "burst": 40,
                                              "strict_schedules": 3}
    # The record counts the cell's slots: placement of the next tenant depends on it.
    assert (await plane.records())[TenantKey(NS, "tuned")].max_running_jobs == 9


async def test_a_refused_target_url_leaves_the_tenant_not_ready_naming_the_field_once(
        plane: Plane) -> None:
    await plane.ready_cell("strict", allow_private=False)
    await plane.operator()
    await plane.create_tenant("acme", NS, targets=[{"name": "ok", "url": "https://hooks.example.com/x"},
                                                   {"name": "inside", "url": PRIVATE}])

    status = await status_where(plane, "acme", "refused",
                                lambda s: condition(s, "Ready").get("reason") == "TargetRefused")
    refused = condition(status, "Ready")
    assert refused["status"] == "False"
    assert "spec.targets[name=inside].url" in refused["message"] and PRIVATE in refused["message"]
    assert status["phase"] != "Ready"

    # Asked again at the backoff's pace (1 s, then 2 s): by the third attempt a second
    # Warning, if the controller sent one, would long have been posted.
    def attempts() -> int:
        return sum(r.endswith("/endpoints") for r in plane.cells.requests)

    async def third_attempt() -> int | None:
        return attempts() if attempts() >= 3 else None
    await eventually(third_attempt, "the controller to ask the cell a third time")

    async def warnings() -> list[dict[str, Any]] | None:
        found = [e for e in await plane.events(NS, "acme") if e["reason"] == "TargetRefused"]
        return found or None
    found = await eventually(warnings, "the TargetRefused Event")
    assert [e["type"] for e in found] == ["Warning"]
    assert "inside" in found[0]["message"]


async def test_an_unreachable_cell_is_said_in_the_status_and_the_tenant_recovers(
        plane: Plane) -> None:
    cell = await plane.ready_cell("a1")
    cell.unreachable = True
    await plane.operator()
    await plane.create_tenant("acme", NS)

    status = await status_where(plane, "acme", "CellUnreachable",
                                lambda s: condition(s, "Ready").get("reason") == "CellUnreachable")
    assert status["phase"] == "Provisioning" and status["cell"] == "a1"
    assert "a1" in condition(status, "Ready")["message"]
    assert not cell.tenants

    cell.unreachable = False
    status = await status_where(plane, "acme", "Ready again", ready)
    assert cell.tenants[status["tenantId"]].active


async def test_an_operator_that_does_not_lead_the_election_writes_nothing(plane: Plane) -> None:
    await plane.ready_cell("a1")
    other = await plane.election_only("region-b")
    operator = await plane.operator("region-a")
    await plane.create_tenant("acme", NS)
    # Three renewals of the other's lease (0.75 s): ample for a controller to act on a
    # Tenant it has in its cache, had it thought itself the leader.
    await other.renewals_from_now(3)
    assert TenantKey(NS, "acme") in operator.cache.tenants
    assert operator.writes == [] and plane.cells.requests == []
    assert await plane.tenant_status("acme", NS) == {} and await plane.records() == {}

    # The leader stops: this operator takes the election over and does it all.
    await other.stop()
    assert await plane.leader() is operator
    status = await status_where(plane, "acme", "Ready", ready)
    assert f"cell put_tenant {status['tenantId']}" in operator.writes


async def test_two_operators_watching_the_same_tenants_only_the_leader_acts(plane: Plane) -> None:
    await plane.ready_cell("a1")
    first, second = await plane.operator("region-a"), await plane.operator("region-b")
    leading = await plane.leader()
    follower = second if leading is first else first
    await plane.create_tenant("acme", NS)

    await status_where(plane, "acme", "Ready", ready)
    assert TenantKey(NS, "acme") in follower.cache.tenants
    assert follower.writes == []
    assert any(w.startswith("cell put_tenant") for w in leading.writes)


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
async def test_a_deleted_tenant_leaves_its_cell_by_its_policy_and_its_finalizer_goes(
        plane: Plane, policy: str) -> None:
    cell = await plane.ready_cell("a1")
    await plane.operator()
    await plane.create_tenant("leaving", NS, deletionPolicy=policy)
    status = await status_where(plane, "leaving", "Ready", ready)
    tenant_id = status["tenantId"]

    await plane.kube.delete(TENANTS, "leaving", namespace=NS)

    async def gone() -> bool:
        return await plane.tenant("leaving", NS) is None
    await eventually(gone, "the Tenant to be gone (its finalizer removed)")
    assert f"DELETE http://a1.cells.test:9001/admin/v1/tenants/{tenant_id}" in plane.cells.requests
    if policy == "Retain":
        # The cell keeps the tenant's rows, disabled.
        assert tenant_id in cell.tenants and not cell.tenants[tenant_id].active
    else:
        assert tenant_id not in cell.tenants
    assert TenantKey(NS, "leaving") not in await plane.records()
    assert await secret_data(plane, "leaving-api-key") is None

    async def removed() -> list[dict[str, Any]] | None:
        return [e for e in await plane.events(NS, "leaving") if e["reason"] == "Removed"] or None
    said = (await eventually(removed, "the Removed Event"))[0]["message"]
    assert ("kept, disabled" if policy == "Retain" else "deleted") in said
