"""The tenant and admin APIs on a real cell database (FastAPI's in-process client)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from cellfixtures import fetch
from cellplane_cells import jobqueue
from cellplane_cells.api.tenant_app import MAX_BODY_BYTES
from cellapi import ADMIN_TOKEN, Cell

@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


def count(conninfo: str, table: str) -> int:
    return int(fetch(conninfo, f"SELECT count(*) FROM {table}")[0][0])


def test_resubmission_with_the_same_key_returns_the_original_job(cell: Cell) -> None:
    auth = cell.tenant("acme")
    first = cell.submit(auth, "order-1", estimate=100)
    again = cell.submit(auth, "order-1", estimate=100)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"

    changed = cell.submit(auth, "order-1", estimate=100, payload={"x": 2})
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert count(cell.conninfo, "jobs") == 1
    assert fetch(cell.conninfo, "SELECT kind, amount FROM ledger") == [("reserve", 100)]
    assert fetch(cell.conninfo, "SELECT kind FROM outbox") == [("job.accepted",)]


def test_concurrent_resubmissions_create_one_job(cell: Cell) -> None:
    auth = cell.tenant("acme", burst=20)
    answers: list[Any] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        barrier.wait()
        answers.append(cell.submit(auth, "same-key"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["job_id"] for a in answers}) == 1
    assert count(cell.conninfo, "jobs") == 1


def test_empty_token_bucket_answers_429_with_retry_after_and_writes_nothing(cell: Cell) -> None:
    auth = cell.tenant("acme", burst=2, jobs_per_second=0.2)
    assert [cell.submit(auth, f"k{i}").status_code for i in range(2)] == [202, 202]
    limited = cell.submit(auth, "k2")
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited.headers["retry-after"]) <= 5
    assert count(cell.conninfo, "jobs") == 2
    assert count(cell.conninfo, "idempotency_keys") == 2


def test_reservation_that_does_not_fit_is_402_and_the_balance_is_untouched(cell: Cell) -> None:
    auth = cell.tenant("acme", credit=100)
    assert cell.submit(auth, "a", estimate=60).status_code == 202
    refused = cell.submit(auth, "b", estimate=60)
    assert refused.status_code == 402
    assert refused.json()["error"]["code"] == "insufficient_funds"
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(40, 60)]
    assert count(cell.conninfo, "jobs") == 1


def test_a_tenant_never_sees_another_tenants_job(cell: Cell) -> None:
    acme, globex = cell.tenant("acme"), cell.tenant("globex")
    job_id = cell.submit(acme, "k").json()["job_id"]
    assert cell.api.get(f"/v1/jobs/{job_id}", headers=acme).status_code == 200
    for response in (cell.api.get(f"/v1/jobs/{job_id}", headers=globex),
                     cell.api.post(f"/v1/jobs/{job_id}:cancel", headers=globex)):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert cell.api.get("/v1/jobs", headers=globex).json()["jobs"] == []
    assert fetch(cell.conninfo, "SELECT status FROM jobs") == [("queued",)]


def test_unknown_or_missing_key_is_401(cell: Cell) -> None:
    cell.tenant("acme")
    for headers in ({}, {"Authorization": "Bearer cpk_not-a-key"}, {"Authorization": "Basic x"}):
        response = cell.api.get("/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthenticated"


def test_keyset_pagination_and_status_filter(cell: Cell) -> None:
    auth = cell.tenant("acme", burst=20)
    ids = [cell.submit(auth, f"k{i}").json()["job_id"] for i in range(7)]
    cell.api.post(f"/v1/jobs/{ids[0]}:cancel", headers=auth)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = cell.api.get("/v1/jobs", params=params, headers=auth).json()
        seen += [job["job_id"] for job in page["jobs"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and sorted(seen) == sorted(ids) and len(seen) == 7
    assert seen == list(reversed(ids))
    cancelled = cell.api.get("/v1/jobs", params={"status": "cancelled"}, headers=auth).json()
    assert [job["job_id"] for job in cancelled["jobs"]] == [ids[0]]
    assert cell.api.get("/v1/jobs", params={"cursor": "garbage!"}, headers=auth).status_code == 422


def test_cancel_of_a_queued_job_refunds_once_and_of_a_running_job_asks_the_worker(cell: Cell) -> None:
    auth = cell.tenant("acme", credit=1000)
    queued = cell.submit(auth, "q", estimate=300).json()["job_id"]
    for _ in range(2):
        answer = cell.api.post(f"/v1/jobs/{queued}:cancel", headers=auth)
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    assert fetch(cell.conninfo, "SELECT kind, amount FROM ledger WHERE job_id = %s ORDER BY kind",
                 uuid.UUID(queued)) == [("refund", 300), ("reserve", 300)]
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(1000, 0)]

    running = cell.submit(auth, "r", estimate=100).json()["job_id"]
    with cell.pool.connection() as conn:
        [claimed] = jobqueue.claim(conn, worker="w", batch=1, lease_seconds=60)
    assert str(claimed.job_id) == running
    answer = cell.api.post(f"/v1/jobs/{running}:cancel", headers=auth).json()
    assert answer["status"] == "running" and answer["cancel_requested"] is True


def test_bad_input_gets_clear_4xx_and_writes_nothing(cell: Cell) -> None:
    auth = cell.tenant("acme", burst=20)
    key = {**auth, "Idempotency-Key": "k"}
    cases = [
        (cell.api.post("/v1/jobs", content=b"{not json", headers={**key, "Content-Type": "application/json"}), 422),
        (cell.api.post("/v1/jobs", json={"target": "default", "payload": 1, "steps": "two"}, headers=key), 422),
        (cell.api.post("/v1/jobs", json={"target": "default", "payload": 1, "steps": 99}, headers=key), 422),
        (cell.api.post("/v1/jobs", json={"target": "default", "payload": 1, "surprise": 1}, headers=key), 422),
        (cell.api.post("/v1/jobs", json={"target": "'; DROP TABLE jobs; --", "payload": 1}, headers=key), 422),
        (cell.api.post("/v1/jobs", json={"target": "default", "payload": 1}, headers=auth), 422),
        (cell.api.post("/v1/jobs", json={"target": "elsewhere", "payload": 1}, headers=key), 422),
        (cell.api.post("/v1/jobs", content=b"x" * (MAX_BODY_BYTES + 1),
                       headers={**key, "Content-Type": "application/json"}), 413),
        (cell.api.get("/v1/jobs/not-a-uuid", headers=auth), 404),
        (cell.api.get("/v1/jobs", params={"status": "nonsense"}, headers=auth), 422),
    ]
    for response, status in cases:
        assert response.status_code == status, response.text
        assert "code" in response.json()["error"]
    assert cell.submit(auth, "k", target="elsewhere").json()["error"]["code"] == "target_not_registered"
    # SQL metacharacters are data, nowhere code.
    odd = cell.submit(auth, "'); DELETE FROM jobs; --", payload={"q": "' OR 1=1 --"})
    assert odd.status_code == 202
    assert count(cell.conninfo, "jobs") == 1
    assert count(cell.conninfo, "idempotency_keys") == 1


def test_admin_api_refuses_tenant_keys_and_the_tenant_api_refuses_the_admin_token(cell: Cell) -> None:
    auth = cell.tenant("acme")
    assert cell.admin.get("/admin/v1/tenants/acme", headers=auth).status_code == 401
    assert cell.api.get("/v1/jobs", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 401
    assert cell.api.get("/admin/v1/tenants/acme", headers=auth).status_code == 404
    health = cell.admin.get("/admin/v1/health").json()
    assert health["epoch"] == 1 and health["in_recovery"] is False
    assert health["lease_remaining_seconds"] > 3000


def test_targets_inside_the_platform_network_are_refused(cell_db: str) -> None:
    production = Cell(cell_db, allow_private=False)
    try:
        assert production.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}).status_code == 200
        for url in ("http://169.254.169.254/latest/meta-data", "http://127.0.0.1:8080/",
                    "http://10.0.0.5/", "http://[::1]/", "ftp://example.com/", "http://metadata/"):
            response = production.admin.put("/admin/v1/tenants/acme/targets",
                                            json={"name": "evil", "url": url})
            assert response.status_code == 422, url
            assert response.json()["error"]["code"] == "target_refused"
        assert count(cell_db, "targets") == 0
    finally:
        production.close()


def test_a_refund_reached_by_four_paths_pays_once(cell: Cell) -> None:
    """The seed's break 3: failure handler, reaper, cancel and admin tool all reach one job.

    The job went dead in the last second before a failover, and its refund
    was lost with it, so every recovery path now tries to pay it at once.
    """
    auth = cell.tenant("acme", credit=1000)
    job_id = uuid.UUID(cell.submit(auth, "lost-refund", estimate=400).json()["job_id"])
    with psycopg.connect(cell.conninfo, autocommit=True) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        conn.execute("UPDATE jobs SET status = 'dead' WHERE job_id = %s", (job_id,))
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(600, 400)]

    paid: list[int] = []
    barrier = threading.Barrier(4)

    def path(kind: str) -> None:
        barrier.wait()
        if kind == "admin":
            paid.append(cell.admin.post(f"/admin/v1/jobs/{job_id}:refund").json()["refunded"])
        elif kind == "cancel":
            cell.api.post(f"/v1/jobs/{job_id}:cancel", headers=auth)
            with cell.pool.connection() as conn:
                paid.append(jobqueue.refund(conn, job_id))
        else:
            with cell.pool.connection() as conn:
                paid.append(jobqueue.refund(conn, job_id))

    threads = [threading.Thread(target=path, args=(k,)) for k in ("failure", "reaper", "cancel", "admin")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(paid) == [0, 0, 0, 400]
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(1000, 0)]
    assert fetch(cell.conninfo, "SELECT count(*) FROM ledger WHERE kind = 'refund'") == [(1,)]


def test_paused_and_moving_tenants_are_refused_clearly_but_can_still_read(cell: Cell) -> None:
    from cellfixtures import write

    auth = cell.tenant("acme")
    job_id = cell.submit(auth, "before").json()["job_id"]
    write(cell.conninfo, "UPDATE tenants SET state = 'paused'")
    paused = cell.submit(auth, "k1")
    assert paused.status_code == 409 and paused.json()["error"]["code"] == "tenant_paused"
    write(cell.conninfo, "UPDATE tenants SET state = 'frozen'")
    moving = cell.submit(auth, "k2")
    assert moving.status_code == 503 and moving.json()["error"]["code"] == "tenant_moving"
    assert moving.headers["retry-after"] == "1"
    assert cell.api.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 200
    assert count(cell.conninfo, "jobs") == 1


def test_expiry_is_set_by_the_databases_clock(cell: Cell) -> None:
    auth = cell.tenant("acme")
    job_id = cell.submit(auth, "k", expires_in_seconds=600).json()["job_id"]
    [(seconds,)] = fetch(cell.conninfo, "SELECT extract(epoch FROM expires_at - created_at) FROM jobs"
                                        " WHERE job_id = %s", uuid.UUID(job_id))
    assert 599 <= float(seconds) <= 601
    assert cell.api.get(f"/v1/jobs/{job_id}", headers=auth).json()["expires_at"] is not None
