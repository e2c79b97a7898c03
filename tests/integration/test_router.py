"""The edge router in front of a real cell: routing by the key's tenant, holding, 503;
a moving tenant held through its cutover and released to its new cell.

Real apiserver, etcd, an operator that placed a tenant in a cell it runs, and
the router as its own process (`cellplane router`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellplane_operator.domain.routing import key_digest
from cellplane_operator.localplane.process import wait_for
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, TenantKey
from cellplane_operator.sites.base import SiteEndpoints
from cellplane_operator.sites.reports import SiteReport, SiteReports
from cellplane_operator.store import EtcdStore
from fastapi.responses import JSONResponse
from starlette.responses import Response

from httpservers import Call, RecordingServer
from metricscrape import scrape
from regionplane import RegionPlane, etcd, ready, ready_cell, secret_data, tenant

HOLD_SECONDS = 1.5
_ROUTER_PIDS: dict[str, int] = {}
MOVE_HOLD_SECONDS = 20.0


@pytest.fixture(scope="module")
def router(plane: RegionPlane) -> Iterator[str]:
    process, url = plane.start_router(plane.kube.etcd.endpoints, hold_seconds=HOLD_SECONDS,
                                      metrics=True)
    _ROUTER_PIDS["router"] = process.pid or 0
    try:
        yield url
    finally:
        process.stop()


@pytest.fixture(scope="module")
def patient_router(plane: RegionPlane) -> Iterator[str]:
    """A router that holds long enough for a test to walk a cutover step by step."""
    process, url = plane.start_router(plane.kube.etcd.endpoints, hold_seconds=MOVE_HOLD_SECONDS,
                                      name="patient-router", metrics=True)
    try:
        yield url
    finally:
        process.stop()


def forwarded(plane: RegionPlane, router: str = "router") -> float:
    """How many answers the router has passed on from a cell: its own 401 for a key of no
    placed tenant reads exactly as a cell's for a wrong secret, so only this tells them apart."""
    samples = scrape(plane.metrics[router])
    return float(sum(v for (name, labels), v in samples.items()
               if name == "cellplane_router_requests_total" and ("outcome", "forwarded") in labels))


def test_a_tenant_submits_and_reads_jobs_through_the_router(
        plane: RegionPlane, router: str) -> None:
    ns = plane.namespace("routed")
    ready_cell(plane, "route-a1")
    with RecordingServer() as target:
        plane.apply(tenant("acme", ns, plan="enterprise", cell="route-a1",
                           targets=[{"name": "default", "url": f"{target.url}/run"}]))
        status = plane.await_status("tenant", "acme", ready, namespace=ns)
        key = (secret_data(plane, ns, "acme-api-key") or {})["api-key"]
        assert key.startswith(f"cpk_{status['tenantId']}.")
        headers = {"Authorization": f"Bearer {key}"}

        submitted = httpx.post(f"{router}/v1/jobs", json={"target": "default", "payload": {"n": 1}},
                               headers={**headers, "Idempotency-Key": "via-router-1"}, timeout=10)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        replayed = httpx.post(f"{router}/v1/jobs", json={"target": "default", "payload": {"n": 1}},
                              headers={**headers, "Idempotency-Key": "via-router-1"}, timeout=10)
        assert replayed.json()["job_id"] == job_id
        assert replayed.headers.get("idempotent-replayed") == "true"

        def done() -> bool:
            job = httpx.get(f"{router}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
            return bool(job["status"] == "succeeded")

        wait_for(done, timeout=60, what="the job, read through the router, to succeed")
        # The same job, straight from the cell: the router forwarded, it did not answer itself.
        direct = httpx.get(f"{status['apiEndpoint']}/v1/jobs/{job_id}", headers=headers, timeout=10)
        assert direct.json()["status"] == "succeeded"


def test_keys_of_no_tenant_are_refused_at_once(router: str) -> None:
    for key in ("cpk_nobody.secret", "not-a-cellplane-key"):
        started = time.monotonic()
        answer = httpx.get(f"{router}/v1/jobs", headers={"Authorization": f"Bearer {key}"},
                           timeout=10)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthenticated"
        assert time.monotonic() - started < HOLD_SECONDS


def test_a_tenant_whose_cell_has_no_owner_is_held_then_told_to_retry(
        plane: RegionPlane, router: str) -> None:
    # A placement record for a cell nobody owns (as between a lease's end and a takeover).
    record = PlacementRecord(cell="ownerless-cell", epoch=1, tenant_id="limbo-tenant", uid="u",
                             max_running_jobs=1)
    etcd(plane, lambda store: PlacementRecords(store).create(
        TenantKey("limbo", "tenant"), record, guard=[]))
    started = time.monotonic()
    answer = httpx.post(f"{router}/v1/jobs", json={"target": "default"},
                        headers={"Authorization": "Bearer cpk_limbo-tenant.secret",
                                 "Idempotency-Key": "held-1"}, timeout=10)
    held = time.monotonic() - started
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "2"
    assert answer.json()["error"]["code"] == "cell_unavailable"
    assert "no owner" in answer.json()["error"]["message"]
    assert held >= HOLD_SECONDS


def test_a_held_request_goes_through_as_soon_as_the_cell_has_an_owner_again(
        plane: RegionPlane, router: str) -> None:
    status = plane.await_status("cell", "route-a1", ready)
    record = PlacementRecord(cell="late-cell", epoch=1, tenant_id="late-tenant", uid="u",
                             max_running_jobs=1)
    etcd(plane, lambda store: PlacementRecords(store).create(
        TenantKey("late", "tenant"), record, guard=[]))
    answers: list[httpx.Response] = []
    request = threading.Thread(target=lambda: answers.append(httpx.get(
        f"{router}/v1/jobs", headers={"Authorization": "Bearer cpk_late-tenant.secret"},
        timeout=10)))
    before = forwarded(plane)
    request.start()
    log = plane.kube.run_dir / "logs" / "router.log"
    wait_for(lambda: "holding a request of tenant late-tenant" in log.read_text(),
             timeout=HOLD_SECONDS, what="the router to hold the request")
    assert not answers
    # An owner appears and its site serves (the route-a1 site stands in for it).
    owner = json.dumps({"region": "region-a", "site": "late-cell@region-a", "epoch": 1,
                        "lease_id": 1}).encode()
    report = SiteReport(role="primary", site="late-cell@region-a", serving=True, epoch=1,
                        endpoints=SiteEndpoints(api=status["endpoints"]["api"],
                                                admin=status["endpoints"]["admin"]))

    async def take_over(store: EtcdStore) -> None:
        await store.put("/cellplane/groups/late-cell/owner", owner)
        await SiteReports(store).publish("late-cell", "region-a", report)

    etcd(plane, take_over)
    request.join(timeout=10)
    [answer] = answers
    # The cell itself answered (it knows no such key): the held request was forwarded.
    assert answer.status_code == 401
    assert answer.json()["error"]["message"] == "unknown API key"
    assert forwarded(plane) == before + 1


async def frozen(call: Call) -> Response:
    """A move's source cell that froze the tenant for its cutover."""
    return JSONResponse({"error": {"code": "tenant_moving", "message": "frozen for a move"}},
                        status_code=503)


def test_a_moving_tenant_is_held_through_the_cutover_then_sent_to_its_new_cell(
        plane: RegionPlane, patient_router: str) -> None:
    target = ready_cell(plane, "route-a1")
    key = TenantKey("moving", "tenant")
    source = RecordingServer(respond=frozen).start()
    try:
        # The source cell, standing in: owned, serving, and refusing the frozen tenant.
        report = SiteReport(role="primary", site="frozen-cell@region-a", serving=True, epoch=1,
                            endpoints=SiteEndpoints(api=source.url, admin=source.url))
        record = PlacementRecord(cell="frozen-cell", epoch=1, tenant_id="moving-tenant", uid="u",
                                 max_running_jobs=1)

        async def place(store: EtcdStore) -> None:
            await store.put("/cellplane/groups/frozen-cell/owner", json.dumps(
                {"region": "region-a", "site": "frozen-cell@region-a", "epoch": 1,
                 "lease_id": 1}).encode())
            await SiteReports(store).publish("frozen-cell", "region-a", report)
            assert await PlacementRecords(store).create(key, record, guard=[])

        async def mark(store: EtcdStore, updated: PlacementRecord) -> None:
            records = PlacementRecords(store)
            stored = await records.read(key)
            assert stored is not None
            assert await records.replace(key, updated, mod_revision=stored.mod_revision, guard=[])

        etcd(plane, place)
        before = forwarded(plane, "patient-router")
        answers: list[httpx.Response] = []
        request = threading.Thread(target=lambda: answers.append(httpx.get(
            f"{patient_router}/v1/jobs", headers={"Authorization": "Bearer cpk_moving-tenant.s"},
            timeout=MOVE_HOLD_SECONDS + 10)))
        request.start()
        # The source refuses before the router saw the record say "moving": the router
        # does not pass the refusal on, it waits for the tenant's route to change.
        wait_for(lambda: len(source.snapshot()) == 1, timeout=10,
                 what="the request to reach the frozen source")
        etcd(plane, lambda store: mark(store, PlacementRecord(
            cell="frozen-cell", epoch=1, tenant_id="moving-tenant", uid="u", max_running_jobs=1,
            moving=True)))
        log = plane.kube.run_dir / "logs" / "patient-router.log"
        wait_for(lambda: "holding a request of tenant moving-tenant" in log.read_text(),
                 timeout=10, what="the router to hold the moving tenant's request")
        assert "being moved to another cell" in log.read_text()
        assert not answers
        # The cutover ends: the record names the target under epoch + 1.
        etcd(plane, lambda store: mark(store, PlacementRecord(
            cell="route-a1", epoch=2, tenant_id="moving-tenant", uid="u", max_running_jobs=1)))
        request.join(timeout=MOVE_HOLD_SECONDS + 10)
        [answer] = answers
        # The target cell answered (it knows no such key): the held request went there,
        # and the source was asked once only.
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["message"] == "unknown API key"
        assert forwarded(plane, "patient-router") == before + 1
        assert len(source.snapshot()) == 1
        assert target["endpoints"]["api"]
    finally:
        source.stop()


def test_a_tenant_still_moving_when_the_hold_ends_is_told_to_retry(
        plane: RegionPlane, router: str) -> None:
    record = PlacementRecord(cell="route-a1", epoch=1, tenant_id="stuck-tenant", uid="u",
                             max_running_jobs=1, moving=True)
    etcd(plane, lambda store: PlacementRecords(store).create(
        TenantKey("stuck", "tenant"), record, guard=[]))
    started = time.monotonic()
    answer = httpx.get(f"{router}/v1/jobs", headers={"Authorization": "Bearer cpk_stuck-tenant.s"},
                       timeout=10)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "2"
    assert "being moved to another cell" in answer.json()["error"]["message"]
    assert time.monotonic() - started >= HOLD_SECONDS


def test_a_write_to_a_fenced_cell_is_answered_at_once_with_the_fence(
        plane: RegionPlane, patient_router: str) -> None:
    """A fence has no new owner to wait for: the router passes the cell's ``cell_fenced``
    on rather than holding the write for a route change (it held each one for its whole
    hold time while the cell answered ``lease_expired``)."""
    ns = plane.namespace("routed-fenced")
    ready_cell(plane, "route-f1")
    plane.apply(tenant("hooli", ns, plan="pro", cell="route-f1",
                       targets=[{"name": "default", "url": "http://127.0.0.1:9/run"}]))
    plane.await_status("tenant", "hooli", ready, namespace=ns)
    key = (secret_data(plane, ns, "hooli-api-key") or {})["api-key"]
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "fenced-1"}
    plane.kube.kubectl("annotate", "cell", "route-f1", "cellplane.io/fenced=disk swap")
    plane.await_status("cell", "route-f1", lambda s: s.get("phase") == "Fenced")

    started = time.monotonic()
    answer = httpx.post(f"{patient_router}/v1/jobs", json={"target": "default", "payload": {}},
                        headers=headers, timeout=MOVE_HOLD_SECONDS + 10)
    answered_in = time.monotonic() - started
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "cell_fenced"
    assert "disk swap" in answer.json()["error"]["message"]
    # Held, it would have taken the router's whole hold time (20 s).
    assert answered_in < MOVE_HOLD_SECONDS / 2, answered_in
    # Reads still answer through the router.
    listed = httpx.get(f"{patient_router}/v1/jobs", headers=headers, timeout=10)
    assert listed.status_code == 200, listed.text


@pytest.fixture(scope="module")
def placed_key(plane: RegionPlane) -> str:
    """A placed tenant's API key, in route-a1."""
    ns = plane.namespace("routed-gates")
    ready_cell(plane, "route-a1")
    plane.apply(tenant("initech", ns, plan="pro", cell="route-a1",
                       targets=[{"name": "default", "url": "http://127.0.0.1:9/run"}]))
    plane.await_status("tenant", "initech", ready, namespace=ns)
    key = str((secret_data(plane, ns, "initech-api-key") or {})["api-key"])

    def digest_recorded() -> bool:
        stored = etcd(plane, lambda store: PlacementRecords(store).read(TenantKey(ns, "initech")))
        return stored is not None and stored.record.key_digest == key_digest(key)

    # Written by the operator once the cell holds the key: the router checks keys with it.
    wait_for(digest_recorded, timeout=30, what="the placement record to carry the key's digest")
    return key


def _resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _raw_request(url: str, head: bytes, chunks: Iterator[bytes] = iter(())) -> bytes:
    """Sends ``head`` then ``chunks`` until the router stops reading; its whole answer."""
    parsed = httpx.URL(url)
    with socket.create_connection((parsed.host, parsed.port), timeout=30) as conn:
        conn.sendall(head)
        try:
            for chunk in chunks:
                conn.sendall(chunk)
        except OSError:
            pass  # The router answered and closed: it reads no more of the body.
        answer = b""
        with contextlib.suppress(OSError):
            while part := conn.recv(65536):
                answer += part
        return answer


def test_a_huge_body_is_refused_without_being_read(
        plane: RegionPlane, router: str, placed_key: str) -> None:
    """100 MB posted, declared and chunked: 413 each time, and the router's memory does not
    grow by the body (it read the whole body before: +100 MB resident, kept)."""
    pid = _ROUTER_PIDS["router"]
    before = _resident_bytes(pid)
    host = httpx.URL(router).netloc.decode()
    total = 100 * 1024 * 1024
    declared = _raw_request(router, (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {placed_key}\r\n"
        f"Idempotency-Key: big-1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {total}\r\n\r\n").encode(), (b"x" * 65536 for _ in range(total // 65536)))
    assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
    assert b'"body_too_large"' in declared
    chunk = b"x" * 65536
    chunked = _raw_request(router, (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {placed_key}\r\n"
        f"Idempotency-Key: big-2\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n").encode(),
        (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(total // len(chunk))))
    assert chunked.startswith(b"HTTP/1.1 413"), chunked[:200]
    assert _resident_bytes(pid) - before < 20 * 1024 * 1024
    # The router still serves.
    assert httpx.get(f"{router}/v1/jobs", headers={"Authorization": f"Bearer {placed_key}"},
                     timeout=10).status_code == 200


def test_an_unknown_tenant_and_a_wrong_secret_get_the_same_401(
        plane: RegionPlane, router: str, placed_key: str) -> None:
    tenant_id = placed_key.removeprefix("cpk_").partition(".")[0]
    wrong_secret = httpx.get(f"{router}/v1/jobs", timeout=10,
                             headers={"Authorization": f"Bearer cpk_{tenant_id}.wrong"})
    unknown = httpx.get(f"{router}/v1/jobs", timeout=10,
                        headers={"Authorization": "Bearer cpk_no-such-tenant.wrong"})
    assert wrong_secret.status_code == unknown.status_code == 401
    assert wrong_secret.content == unknown.content
    assert sorted(wrong_secret.headers.keys()) == sorted(unknown.headers.keys())
    # Both refused by the router itself, which checks the whole key: no cell round trip
    # for one and not the other to time.
    before = forwarded(plane)
    for _ in range(3):
        httpx.get(f"{router}/v1/jobs", timeout=10,
                  headers={"Authorization": f"Bearer cpk_{tenant_id}.wrong"})
    assert forwarded(plane) == before


@pytest.mark.parametrize("path, status", [
    ("/v1/%2e%2e/openapi.json", 404), ("/openapi.json", 404), ("/v1/jobs/%2e%2e", 404),
    ("/docs", 404), ("/v1/jobs/%00", 400), ("/v1/jobs/a%0Ab", 400), ("/v1/jobs?cursor=%00", 400),
])
def test_only_the_tenant_api_is_reachable_and_bad_paths_are_json(
        router: str, placed_key: str, path: str, status: int) -> None:
    answer = httpx.get(f"{router}{path}", headers={"Authorization": f"Bearer {placed_key}"},
                       timeout=10)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] in ("not_found", "invalid_request")


def test_json_the_database_cannot_store_is_a_422_through_the_router(
        router: str, placed_key: str) -> None:
    for body in (b'{"target": "default", "payload": NaN}',
                 b'{"target": "default", "payload": "\\u0000"}',
                 b'{"target": "default", "payload": 1e400}',
                 b'{"target": "default", "payload": "\\ud800"}',
                 b'{"target": "default", "payload": {}, "steps": true}'):
        answer = httpx.post(f"{router}/v1/jobs", content=body, timeout=10, headers={
            "Authorization": f"Bearer {placed_key}", "Idempotency-Key": "nan-1",
            "Content-Type": "application/json"})
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request"
