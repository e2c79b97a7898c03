"""The regional operator on the real apiserver, etcd, Postgres and cell processes: placement.

Module-scoped operators for region-a and region-c run the cells' sites with the
local site driver; one of them leads placement. Each test uses its own
namespace and cells, and pins its tenants to its cells where the choice of
cell is not what it tests (the capacity test has region-c to itself).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.placement.records import TenantKey
from httpservers import RecordingServer
from regionplane import (
    RegionPlane, cell, cell_database, condition, db_rows, ready, ready_cell, records, secret_data,
    tenant,
)


@pytest.fixture(scope="module")
def plane(kube: LocalControlPlane) -> Iterator[RegionPlane]:
    regions = RegionPlane(kube, ("region-a", "region-c"))
    regions.start_operator("region-a")
    regions.start_operator("region-c")
    try:
        yield regions
    finally:
        regions.close()


def test_shared_tenant_is_placed_and_runs_a_job_with_the_key_from_its_secret(
        plane: RegionPlane, target: RecordingServer) -> None:
    ns = plane.namespace("e2e")
    status = ready_cell(plane, "e2e-a1")
    assert status["activeRegion"] == "region-a" and status["epoch"] >= 1
    assert condition(status, "Ready")["reason"] == "Serving"

    plane.apply(tenant("acme", ns, plan="enterprise",
                       targets=[{"name": "default", "url": f"{target.url}/run"}]))
    status = plane.await_status("tenant", "acme", ready, namespace=ns)
    assert (status["cell"], status["epoch"], status["apiKeySecret"]) == ("e2e-a1", 1, "acme-api-key")
    assert condition(status, "Placed")["status"] == "True"
    assert status["quotas"]["maxRunningJobs"] == 20
    assert status["observedGeneration"] == 1

    key = secret_data(plane, ns, "acme-api-key")
    assert key is not None and key["api-key"].startswith("cpk_")
    headers = {"Authorization": f"Bearer {key['api-key']}", "Idempotency-Key": "e2e-1"}
    submitted = httpx.post(f"{status['apiEndpoint']}/v1/jobs", headers=headers,
                           json={"target": "default", "payload": {"hello": "cell"}})
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]

    def succeeded() -> bool:
        job = httpx.get(f"{status['apiEndpoint']}/v1/jobs/{job_id}", headers=headers).json()
        return bool(job["status"] == "succeeded")

    wait_for(succeeded, timeout=60, what="the job to run through the tenant's cell")
    assert any(call.json.get("payload") == {"hello": "cell"} for call in target.snapshot())
    assert httpx.get(f"{status['apiEndpoint']}/v1/jobs/{job_id}",
                     headers={"Authorization": "Bearer cpk_wrong-key-000000000000"}).status_code == 401

    # Several operators watch these objects: kopf must have left none of its own state
    # on them (progress or diff-base annotations, its finalizer); ours is the only one.
    for kind, name, namespace in (("tenant", "acme", ns), ("cell", "e2e-a1", None)):
        meta = (plane.get(kind, name, namespace) or {})["metadata"]
        assert not [a for a in meta.get("annotations") or {} if "kopf" in a or "cellplane.io/" in a]
        assert meta["finalizers"] == ["cellplane.io/placement"]

    placed = records(plane)[TenantKey(ns, "acme")]
    assert (placed.cell, placed.epoch, placed.max_running_jobs) == ("e2e-a1", 1, 20)
    load = plane.await_status("cell", "e2e-a1", lambda s: s.get("tenants") == 1)
    assert load["slotsInUse"] == 20


def test_least_loaded_cell_capacity_exhaustion_and_a_region_without_cells(plane: RegionPlane) -> None:
    ns = plane.namespace("capacity")
    ready_cell(plane, "cap-small", "region-c", tenants=5, slots=6)
    ready_cell(plane, "cap-large", "region-c", tenants=5, slots=12)
    # Pro tenants take 5 slots each, and go where the slot ratio ends lowest: large
    # (5/12 against 5/6), then a tie at 10/12 and 5/6 broken by name (large), then
    # the only cell with 5 slots free (small).
    placed: list[str] = []
    for name in ("p1", "p2", "p3"):
        plane.apply(tenant(name, ns, plan="pro", region="region-c"))
        placed.append(plane.await_status("tenant", name, ready, namespace=ns)["cell"])
    assert placed == ["cap-large", "cap-large", "cap-small"]

    plane.apply(tenant("p4", ns, plan="pro", region="region-c"))
    status = plane.await_status("tenant", "p4", lambda s: s.get("phase") == "Unplaceable",
                                namespace=ns)
    placed_condition = condition(status, "Placed")
    assert (placed_condition["status"], placed_condition["reason"]) == ("False", "NoCapacity")
    assert "5" in placed_condition["message"]
    assert TenantKey(ns, "p4") not in records(plane)

    plane.apply(tenant("far", ns, plan="free", region="region-z"))
    status = plane.await_status("tenant", "far", lambda s: s.get("phase") == "Unplaceable",
                                namespace=ns)
    assert condition(status, "Placed")["reason"] == "NoCellInRegion"
    events = plane.kube.kubectl("get", "events", "-n", ns, "--field-selector",
                                "involvedObject.name=far", "-o", "json").stdout
    assert any(e["reason"] == "NoCellInRegion" for e in json.loads(events)["items"])

    # Capacity freed: the waiting tenant is placed by the operator's retry, no edit needed.
    plane.kube.kubectl("delete", "tenant", "p1", "-n", ns, "--wait=true", "--timeout=60s")
    status = plane.await_status("tenant", "p4", ready, namespace=ns)
    assert status["cell"] == "cap-large"
    for region in plane.regions:
        assert "Traceback" not in (plane.kube.run_dir / "logs" / f"operator-{region}.log").read_text()


def test_pinned_cells_are_honoured_or_the_tenant_says_why_not(plane: RegionPlane) -> None:
    ns = plane.namespace("pinning")
    ready_cell(plane, "pin-a", tenants=3, slots=10)
    ready_cell(plane, "pin-b", tenants=3, slots=10)
    plane.apply(tenant("pinned", ns, cell="pin-b"))
    assert plane.await_status("tenant", "pinned", ready, namespace=ns)["cell"] == "pin-b"

    plane.apply(tenant("ghost", ns, cell="no-such-cell"))
    status = plane.await_status("tenant", "ghost", lambda s: s.get("phase") == "Unplaceable",
                                namespace=ns)
    assert condition(status, "Placed")["reason"] == "PinnedCellNotFound"

    plane.apply(tenant("big", ns, plan="enterprise", cell="pin-b"))
    status = plane.await_status("tenant", "big", lambda s: s.get("phase") == "Unplaceable",
                                namespace=ns)
    assert condition(status, "Placed")["reason"] == "PinnedCellFull"

    # The missing cell appears: the pin is honoured without touching the tenant.
    ready_cell(plane, "no-such-cell")
    assert plane.await_status("tenant", "ghost", ready, namespace=ns)["cell"] == "no-such-cell"


def test_a_quota_change_reaches_the_cell_database(plane: RegionPlane) -> None:
    ns = plane.namespace("quotas")
    ready_cell(plane, "quota-a1")
    plane.apply(tenant("tuned", ns, plan="pro", cell="quota-a1"))
    status = plane.await_status("tenant", "tuned", ready, namespace=ns)
    conninfo = cell_database(plane, "quota-a1")
    tenant_id = status["tenantId"]
    assert db_rows(conninfo, "SELECT max_running_jobs, burst FROM tenants WHERE tenant_id = %s",
                   tenant_id) == [(5, 20)]

    started = time.monotonic()
    plane.kube.kubectl("patch", "tenant", "tuned", "-n", ns, "--type=merge", "-p",
                       json.dumps({"spec": {"quotas": {"maxRunningJobs": 9, "burst": 40}}}))
    wait_for(lambda: db_rows(conninfo, "SELECT max_running_jobs, burst FROM tenants WHERE tenant_id = %s",
                             tenant_id) == [(9, 40)],
             timeout=30, interval=0.05, what="the new quotas in the cell database")
    print(f"\nquota change -> cell database: {time.monotonic() - started:.2f}s")
    status = plane.await_status("tenant", "tuned", lambda s: s.get("observedGeneration") == 2,
                                namespace=ns)
    assert status["quotas"]["maxRunningJobs"] == 9
    assert records(plane)[TenantKey(ns, "tuned")].max_running_jobs == 9
    plane.await_status("cell", "quota-a1", lambda s: s.get("slotsInUse") == 9)


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_deleting_a_tenant_follows_its_deletion_policy(plane: RegionPlane, policy: str) -> None:
    ns = plane.namespace(f"deletion-{policy.lower()}")
    cell_name = f"del-{policy.lower()}"
    ready_cell(plane, cell_name)
    plane.apply(tenant("leaving", ns, deletionPolicy=policy, cell=cell_name))
    status = plane.await_status("tenant", "leaving", ready, namespace=ns)
    conninfo = cell_database(plane, cell_name)
    tenant_id = status["tenantId"]
    key = secret_data(plane, ns, "leaving-api-key")
    assert key is not None

    plane.kube.kubectl("delete", "tenant", "leaving", "-n", ns, "--wait=true", "--timeout=60s")
    assert plane.get("tenant", "leaving", ns) is None
    assert secret_data(plane, ns, "leaving-api-key") is None
    assert TenantKey(ns, "leaving") not in records(plane)
    plane.await_status("cell", cell_name, lambda s: s.get("tenants") == 0)
    rows = db_rows(conninfo, "SELECT state FROM tenants WHERE tenant_id = %s", tenant_id)
    assert rows == ([("retired",)] if policy == "Retain" else [])


def test_a_tenant_created_again_after_a_retained_deletion_starts_empty(
        plane: RegionPlane, target: RecordingServer) -> None:
    """Deleted with Retain and created again under the same name, a Tenant is a new
    object: it must not list the old jobs nor replay the old idempotency keys. The old
    rows stay in the cell, disabled, under the old object's tenant id."""
    ns = plane.namespace("recreated")
    ready_cell(plane, "again-a1")
    spec = {"plan": "pro", "cell": "again-a1",
            "targets": [{"name": "default", "url": f"{target.url}/run"}]}

    def submit(status: dict[str, Any], idempotency_key: str) -> httpx.Response:
        """As a client does: a 503 (the cell's lease renewal late on a loaded machine)
        is tried again; anything else is the answer."""
        key = secret_data(plane, ns, "phoenix-api-key")
        assert key is not None
        answers: list[httpx.Response] = []

        def answered() -> bool:
            answers.append(httpx.post(f"{status['apiEndpoint']}/v1/jobs", json={
                "target": "default", "payload": {"n": 1}}, headers={
                "Authorization": f"Bearer {key['api-key']}", "Idempotency-Key": idempotency_key}))
            return answers[-1].status_code != 503

        wait_for(answered, timeout=60, interval=0.5, what="an answer other than 503")
        return answers[-1]

    plane.apply(tenant("phoenix", ns, **spec))
    first = plane.await_status("tenant", "phoenix", ready, namespace=ns)
    old = submit(first, "order-1")
    assert old.status_code == 202, old.text
    old_key = secret_data(plane, ns, "phoenix-api-key")
    assert old_key is not None
    plane.kube.kubectl("delete", "tenant", "phoenix", "-n", ns, "--wait=true", "--timeout=60s")
    # As if the garbage collector had not yet removed the old object's Secret: its key
    # names the old tenant id and would unlock the retained rows.
    plane.apply({"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "phoenix-api-key", "namespace": ns},
                 "stringData": old_key})

    plane.apply(tenant("phoenix", ns, **spec))
    second = plane.await_status("tenant", "phoenix", ready, namespace=ns)
    assert second["tenantId"] != first["tenantId"]
    new_key = secret_data(plane, ns, "phoenix-api-key")
    assert new_key is not None and new_key["api-key"] != old_key["api-key"]
    assert new_key["api-key"].startswith(f"cpk_{second['tenantId']}.")
    replayed = submit(second, "order-1")
    assert replayed.status_code == 202, replayed.text
    assert replayed.json()["job_id"] != old.json()["job_id"], "the old idempotency key replayed"
    key = secret_data(plane, ns, "phoenix-api-key")
    assert key is not None
    listed = httpx.get(f"{second['apiEndpoint']}/v1/jobs",
                       headers={"Authorization": f"Bearer {key['api-key']}"}).json()["jobs"]
    assert [job["job_id"] for job in listed] == [replayed.json()["job_id"]]
    conninfo = cell_database(plane, "again-a1")
    assert db_rows(conninfo, "SELECT state FROM tenants WHERE tenant_id = %s",
                   first["tenantId"]) == [("retired",)]
    assert db_rows(conninfo, "SELECT count(*) FROM jobs WHERE tenant_id = %s",
                   first["tenantId"]) == [(1,)]


def test_a_dedicated_tenant_gets_its_own_cell_which_goes_with_it(plane: RegionPlane) -> None:
    ns = plane.namespace("dedicated")
    plane.apply(tenant("bigco", ns, plan="enterprise", isolation="dedicated",
                       deletionPolicy="Delete"))
    status = plane.await_status("tenant", "bigco", ready, namespace=ns, timeout=120)
    cell_name = status["cell"]
    owned = plane.get("cell", cell_name)
    assert owned is not None
    assert owned["spec"]["tier"] == "dedicated" and owned["spec"]["capacity"]["tenants"] == 1
    assert owned["metadata"]["ownerReferences"][0]["name"] == "bigco"
    assert owned["status"]["tenants"] == 1

    # A shared tenant never lands in someone's dedicated cell.
    plane.apply(tenant("small", ns, plan="free"))
    status = plane.await_status("tenant", "small", lambda s: s.get("phase") in ("Ready", "Unplaceable"),
                                namespace=ns)
    assert status.get("cell") != cell_name

    plane.kube.kubectl("delete", "tenant", "bigco", "-n", ns, "--wait=true", "--timeout=90s")
    wait_for(lambda: plane.get("cell", cell_name) is None, timeout=60,
             what=f"the dedicated cell {cell_name} to be deleted with its tenant")


def test_a_cell_that_holds_tenants_cannot_be_deleted(plane: RegionPlane) -> None:
    ns = plane.namespace("guarded")
    ready_cell(plane, "guarded-a1")
    plane.apply(tenant("resident", ns, cell="guarded-a1"))
    plane.await_status("tenant", "resident", ready, namespace=ns)
    plane.await_status("cell", "guarded-a1", lambda s: s.get("tenants") == 1)
    refused = plane.kube.kubectl("delete", "cell", "guarded-a1", "--wait=false", check=False)
    assert refused.returncode != 0
    assert "still holds 1 tenant(s)" in refused.stderr
    assert plane.get("cell", "guarded-a1") is not None

    plane.kube.kubectl("delete", "tenant", "resident", "-n", ns, "--wait=true", "--timeout=60s")
    plane.await_status("cell", "guarded-a1", lambda s: s.get("tenants") == 0)
    plane.kube.kubectl("delete", "cell", "guarded-a1", "--wait=true", "--timeout=60s")
    assert plane.get("cell", "guarded-a1") is None


def test_a_killed_site_process_is_restarted_by_the_driver(plane: RegionPlane) -> None:
    status = ready_cell(plane, "restart-a1")
    state = json.loads((plane.state_dir("region-a") / "restart-a1@region-a" / "site.json").read_text())
    api = state["processes"]["api"]

    os.kill(api["pid"], signal.SIGKILL)

    def restarted() -> bool:
        current = json.loads((plane.state_dir("region-a") / "restart-a1@region-a" / "site.json").read_text())
        # Between noticing the death and starting again, the driver's record has no API.
        fresh = current["processes"].get("api")
        if fresh is None or fresh["pid"] == api["pid"]:
            return False
        try:
            return httpx.get(f"{status['endpoints']['api']}/openapi.json", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(restarted, timeout=30, what="the driver to restart the killed API process")

    def reported() -> bool:
        events = json.loads(plane.kube.kubectl(
            "get", "events", "-n", "default", "--field-selector",
            "involvedObject.name=restart-a1", "-o", "json").stdout)
        return any(e["reason"] == "ProcessRestarted" and "restarted api" in e["message"]
                   for e in events["items"])

    wait_for(reported, timeout=30, what="a ProcessRestarted Event on the cell")


def test_tenant_ids_of_look_alike_names_never_collide(plane: RegionPlane) -> None:
    ns1, ns2 = plane.namespace("a-b"), plane.namespace("a")
    ready_cell(plane, "ids-a1")
    plane.apply(tenant("c", ns1, cell="ids-a1"))
    plane.apply(tenant("b-c", ns2, cell="ids-a1"))
    first = plane.await_status("tenant", "c", ready, namespace=ns1)
    second = plane.await_status("tenant", "b-c", ready, namespace=ns2)
    assert first["tenantId"] != second["tenantId"]


def _events(plane: RegionPlane, namespace: str | None, name: str, reason: str) -> list[Any]:
    """The Events of ``reason`` about ``name``, once at least one was posted (they are
    posted beside the status, not before it)."""
    where = ["-n", namespace] if namespace else ["-A"]

    def found() -> list[Any]:
        items = json.loads(plane.kube.kubectl(
            "get", "events", *where, "--field-selector", f"involvedObject.name={name}",
            "-o", "json").stdout)["items"]
        return [e for e in items if e.get("reason") == reason]

    wait_for(lambda: bool(found()), timeout=30, what=f"a {reason} Event about {name}")
    return found()


def test_a_target_the_cell_refuses_ends_in_a_condition_said_once(plane: RegionPlane) -> None:
    """It got a Placed Event and then no status while the operator retried for ever."""
    ns = plane.namespace("refused")
    ready_cell(plane, "strict-a1", driver={"allowPrivateTargets": False})
    plane.apply(tenant("careless", ns, cell="strict-a1",
                       targets=[{"name": "inside", "url": "http://127.0.0.1:9/"}]))
    status = plane.await_status(
        "tenant", "careless", lambda s: condition(s, "Ready").get("reason") == "TargetRefused",
        namespace=ns)
    message = condition(status, "Ready")["message"]
    assert "spec.targets[name=inside].url http://127.0.0.1:9/" in message, message
    assert status["phase"] == "Provisioning" and status["cell"] == "strict-a1"
    # A window for the retries (1, 2, 4 s) and a resync to happen: still one Warning.
    time.sleep(8)
    refusals = _events(plane, ns, "careless", "TargetRefused")
    assert len(refusals) == 1 and refusals[0]["type"] == "Warning", refusals

    # Taken out of the spec (a public URL would need DNS, which tests do not have),
    # the refusal ends and the tenant serves.
    plane.kube.kubectl("patch", "tenant", "careless", "-n", ns, "--type=merge",
                       "-p", json.dumps({"spec": {"targets": []}}))
    plane.await_status("tenant", "careless", ready, namespace=ns)


def test_a_cell_in_an_unknown_region_says_so(plane: RegionPlane) -> None:
    """No operator runs region-z: nobody wrote the cell's status at all."""
    plane.apply(cell("nowhere-z1", "region-z"))
    status = plane.await_status(
        "cell", "nowhere-z1", lambda s: condition(s, "Accepted").get("reason") == "UnknownRegion")
    assert status["phase"] == "Pending"
    accepted = condition(status, "Accepted")
    assert accepted["status"] == "False" and "spec.region 'region-z'" in accepted["message"]
    assert len(_events(plane, None, "nowhere-z1", "UnknownRegion")) == 1
    plane.kube.kubectl("delete", "cell", "nowhere-z1", "--wait=true", "--timeout=60s")


def test_a_cell_shrunk_below_its_use_says_so(plane: RegionPlane) -> None:
    """Capacity shrunk under the placed tenants, or the tier made dedicated with two
    tenants inside, was accepted without a word."""
    ns = plane.namespace("shrink")
    ready_cell(plane, "shrink-a1")
    for name in ("one", "two"):
        plane.apply(tenant(name, ns, cell="shrink-a1"))
    for name in ("one", "two"):
        plane.await_status("tenant", name, lambda s: s.get("cell") == "shrink-a1", namespace=ns)
    plane.await_status("cell", "shrink-a1", lambda s: s.get("tenants") == 2 and condition(
        s, "Accepted").get("status") == "True")

    plane.kube.kubectl("patch", "cell", "shrink-a1", "--type=merge", "-p", json.dumps(
        {"spec": {"capacity": {"tenants": 1, "workerSlots": 40}}}))
    status = plane.await_status("cell", "shrink-a1", lambda s: condition(
        s, "Accepted").get("reason") == "CapacityBelowUse")
    assert "spec.capacity.tenants is 1 but 2 tenants are placed" in condition(
        status, "Accepted")["message"]
    plane.kube.kubectl("patch", "cell", "shrink-a1", "--type=merge", "-p", json.dumps(
        {"spec": {"tier": "dedicated"}}))
    status = plane.await_status("cell", "shrink-a1", lambda s: "spec.tier is dedicated" in condition(
        s, "Accepted").get("message", ""))
    assert condition(status, "Ready")["status"] == "True", "the site's conditions are kept"
    assert len(_events(plane, None, "shrink-a1", "CapacityBelowUse")) == 1
