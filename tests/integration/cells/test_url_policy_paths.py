"""One URL policy on every way a URL reaches a cell, and at every call (issue #18, items 1-2).

Real cell databases on a real Postgres, two cells side by side: a development
cell that allows loopback targets (the source of an import or a move) and a
production cell that does not. A URL the production cell refuses must not get
in by an import or a move in, and a row that is there anyway (written before
the policy held, or under a laxer one) must not be called by the workers or the
relay. A tenant's set of targets and webhooks is replaced whole, removals included.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cellapi import Cell
from cellfixtures import create_cell_database, enqueue, fetch, write
from cellplane_cells.egress import guarded_client
from cellplane_cells.relay import Relay, RelayConfig
from cellplane_cells.worker import Worker, WorkerConfig
from httpservers import RecordingServer

MOVE = "move-1"


@pytest.fixture
def lax(cell_db: str) -> Iterator[Cell]:
    """A development cell: loopback targets allowed."""
    c = Cell(cell_db, allow_private=True)
    yield c
    c.close()


@pytest.fixture
def strict(cell_postgres: Any) -> Iterator[Cell]:
    """A production cell: loopback and private targets refused."""
    conninfo = create_cell_database(cell_postgres.postgres["cell"], f"strict_{uuid.uuid4().hex[:12]}")
    c = Cell(conninfo, allow_private=False)
    yield c
    c.close()


@pytest.fixture
def receiver() -> Iterator[RecordingServer]:
    server = RecordingServer().start()
    yield server
    server.stop()


def ok(answer: Any, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json() if status != 204 else None


def loopback_tenant(cell: Cell, tenant: str = "acme") -> None:
    ok(cell.admin.put(f"/admin/v1/tenants/{tenant}", json={"plan": "pro"}))
    ok(cell.admin.put(f"/admin/v1/tenants/{tenant}/targets",
                      json={"name": "default", "url": "http://127.0.0.1:9/run"}), 204)
    ok(cell.admin.put(f"/admin/v1/tenants/{tenant}/webhooks",
                      json={"url": "http://[2002:7f00:1::]:9/hook", "secret": "s" * 16}))


# --- the ways in -----------------------------------------------------------------------------

def test_registration_refuses_embedded_loopback(strict: Cell) -> None:
    ok(strict.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}))
    for url in ("http://[2002:7f00:1::]/", "http://[::ffff:127.0.0.1]/", "http://2130706433/",
                "http://[64:ff9b::a9fe:a9fe]/"):
        refused = strict.admin.put("/admin/v1/tenants/acme/webhooks",
                                   json={"url": url, "secret": "s" * 16})
        assert refused.status_code == 422, (url, refused.text)
        assert refused.json()["error"]["code"] == "target_refused"
    assert fetch(strict.conninfo, "SELECT count(*) FROM webhook_endpoints")[0][0] == 0


def test_an_import_is_held_to_the_importing_cells_policy(lax: Cell, strict: Cell,
                                                       cell_postgres: Any) -> None:
    loopback_tenant(lax)
    bundle = ok(lax.admin.get("/admin/v1/tenants/acme/export"))
    refused = strict.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 1, "bundle": bundle})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "target_refused"
    assert "targets[default].url (http://127.0.0.1:9/run)" in error["message"]
    assert "webhooks[" in error["message"] and "carries the IPv4 address 127.0.0.1" in error["message"]
    # Nothing of the tenant landed.
    assert fetch(strict.conninfo, "SELECT count(*) FROM tenants")[0][0] == 0
    # Another development cell takes the same bundle.
    other = Cell(create_cell_database(cell_postgres.postgres["cell"], f"lax_{uuid.uuid4().hex[:12]}"),
                 allow_private=True)
    try:
        ok(other.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 1, "bundle": bundle}))
    finally:
        other.close()


def test_a_move_in_is_held_to_the_target_cells_policy(lax: Cell, strict: Cell) -> None:
    loopback_tenant(lax)
    ok(lax.admin.post("/admin/v1/tenants/acme/move-out", json={"move_id": MOVE}))
    batch: dict[str, list[Any]] = {}
    for table in ("tenant", "wallet", "rate_bucket", "targets", "webhooks"):
        page = ok(lax.admin.get("/admin/v1/tenants/acme/move-out/rows", params={"table": table}))
        batch[table] = page["rows"]
    refused = strict.admin.post("/admin/v1/tenants/acme/move-in",
                                json={"move_id": MOVE, "epoch": 2, "rows": batch})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "target_refused"
    assert "targets[default].url" in refused.json()["error"]["message"]
    assert fetch(strict.conninfo, "SELECT count(*) FROM tenants")[0][0] == 0
    # A later batch of changes carrying only a webhook is held to it as well.
    ok(strict.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2,
        "rows": {k: v for k, v in batch.items() if k not in ("targets", "webhooks")}}))
    refused = strict.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"webhooks": batch["webhooks"]}})
    assert refused.status_code == 422, refused.text
    assert fetch(strict.conninfo, "SELECT count(*) FROM webhook_endpoints")[0][0] == 0


def test_the_operator_can_ask_a_cell_before_a_move(strict: Cell, lax: Cell) -> None:
    body = {"targets": [{"name": "api", "url": "https://93.184.216.34/run"},
                        {"name": "local", "url": "http://127.0.0.1:9/run"}],
            "webhooks": [{"url": "http://[::ffff:10.0.0.1]/hook"}]}
    refused = ok(strict.admin.post("/admin/v1/endpoints:check", json=body))["refused"]
    assert [r["field"] for r in refused] == ["targets[1].url", "webhooks[0].url"]
    assert "10.0.0.1" in refused[1]["reason"]
    assert ok(lax.admin.post("/admin/v1/endpoints:check", json=body))["refused"] == []


# --- at the call -----------------------------------------------------------------------------

def test_workers_never_call_a_refused_target_that_is_in_the_database(
        strict: Cell, receiver: RecordingServer) -> None:
    """A row from before the policy held (or a laxer cell's): the worker refuses it at the
    call, permanently, and the target hears nothing."""
    ok(strict.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}))
    write(strict.conninfo, "INSERT INTO targets (tenant_id, name, url) VALUES ('acme', 'default', %s)",
          f"http://127.0.0.1:{receiver.port}/run")
    with strict.pool.connection() as conn:
        [job_id] = enqueue(conn, "acme", 1)

    async def run() -> None:
        async with guarded_client(allow_private=False) as http:
            worker = Worker(strict.pool, http, WorkerConfig(worker_id="w", epoch=1))
            await worker.run_until_idle()

    asyncio.run(run())
    status, code, error = fetch(strict.conninfo, "SELECT status, error_code, last_error FROM jobs"
                                " WHERE job_id = %s", job_id)[0]
    assert (status, code) == ("dead", "target_refused"), error
    assert "127.0.0.1" in error
    assert receiver.snapshot() == []


def test_the_relay_never_calls_a_refused_webhook_that_is_in_the_database(
        strict: Cell, receiver: RecordingServer) -> None:
    ok(strict.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}))
    write(strict.conninfo, "INSERT INTO webhook_endpoints (tenant_id, url, secret)"
          " VALUES ('acme', %s, 'whsec_0123456789abcdef')",
          f"http://[::ffff:127.0.0.1]:{receiver.port}/hook")
    write(strict.conninfo, "INSERT INTO outbox (event_id, tenant_id, kind, payload)"
          " VALUES (%s, 'acme', 'job.completed', '{}')", uuid.uuid4())

    async def run() -> int:
        async with guarded_client(allow_private=False) as http:
            relay = Relay(strict.pool, http, RelayConfig(poll_seconds=0.05))
            return await relay.run_once()

    assert asyncio.run(run()) == 1
    status, attempts, error = fetch(strict.conninfo,
                                    "SELECT status, attempts, last_error FROM deliveries")[0]
    # Dead at the first attempt: asking again would be refused again.
    assert (status, attempts) == ("dead", 1), error
    assert "URL policy" in error
    assert receiver.snapshot() == []


def test_a_development_cell_still_calls_loopback_through_the_guard(
        lax: Cell, receiver: RecordingServer) -> None:
    ok(lax.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}))
    ok(lax.admin.put("/admin/v1/tenants/acme/targets",
                     json={"name": "default", "url": f"{receiver.url}/run"}), 204)
    with lax.pool.connection() as conn:
        [job_id] = enqueue(conn, "acme", 1)

    async def run() -> None:
        async with guarded_client(allow_private=True) as http:
            await Worker(lax.pool, http, WorkerConfig(worker_id="w", epoch=1)).run_until_idle()

    asyncio.run(run())
    assert fetch(lax.conninfo, "SELECT status FROM jobs WHERE job_id = %s", job_id)[0][0] == "succeeded"
    assert len(receiver.snapshot()) == 1


# --- removal -----------------------------------------------------------------------------------

def test_the_endpoint_set_replaces_the_tenants_targets_and_webhooks(
        lax: Cell, receiver: RecordingServer) -> None:
    ok(lax.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}))
    hook = f"{receiver.url}/kept"
    gone = f"{receiver.url}/removed"
    both = {"targets": [{"name": "default", "url": f"{receiver.url}/run"},
                        {"name": "old", "url": f"{receiver.url}/old"}],
            "webhooks": [{"url": hook, "secret": "s" * 16}, {"url": gone, "secret": "s" * 16}]}
    ok(lax.admin.put("/admin/v1/tenants/acme/endpoints", json=both))
    # An event waits for both endpoints when the second is taken out.
    write(lax.conninfo, "INSERT INTO outbox (event_id, tenant_id, kind, payload)"
          " VALUES (%s, 'acme', 'job.completed', '{}')", uuid.uuid4())
    fan_out(lax)
    assert fetch(lax.conninfo, "SELECT count(*) FROM deliveries")[0][0] == 2

    one = {"targets": [both["targets"][0]], "webhooks": [both["webhooks"][0]]}
    removed = ok(lax.admin.put("/admin/v1/tenants/acme/endpoints", json=one))
    assert removed == {"targets_removed": 1, "webhooks_removed": 1}
    assert fetch(lax.conninfo, "SELECT name FROM targets WHERE tenant_id = 'acme'") == [("default",)]
    assert fetch(lax.conninfo, "SELECT url FROM webhook_endpoints") == [(hook,)]
    # Idempotent: the same set again removes nothing.
    assert ok(lax.admin.put("/admin/v1/tenants/acme/endpoints", json=one)) == {
        "targets_removed": 0, "webhooks_removed": 0}

    async def deliver() -> None:
        async with guarded_client(allow_private=True) as http:
            await Relay(lax.pool, http, RelayConfig(poll_seconds=0.05)).run_once()

    asyncio.run(deliver())
    assert [c.path for c in receiver.snapshot()] == ["/kept"]
    # Empty sets remove everything.
    ok(lax.admin.put("/admin/v1/tenants/acme/endpoints", json={}))
    assert fetch(lax.conninfo, "SELECT count(*) FROM targets")[0][0] == 0
    assert fetch(lax.conninfo, "SELECT count(*) FROM webhook_endpoints")[0][0] == 0


def test_a_refused_url_in_the_set_changes_nothing(strict: Cell) -> None:
    ok(strict.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"}))
    ok(strict.admin.put("/admin/v1/tenants/acme/endpoints", json={
        "targets": [{"name": "api", "url": "https://93.184.216.34/run"}]}))
    refused = strict.admin.put("/admin/v1/tenants/acme/endpoints", json={
        "targets": [{"name": "other", "url": "https://93.184.216.34/other"}],
        "webhooks": [{"url": "http://[2002:7f00:1::]/hook", "secret": "s" * 16}]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith("webhooks[0].url (http://[2002:7f00:1::]/hook)")
    assert fetch(strict.conninfo, "SELECT name FROM targets") == [("api",)]
    duplicate = strict.admin.put("/admin/v1/tenants/acme/endpoints", json={
        "targets": [{"name": "api", "url": "https://93.184.216.34/a"},
                    {"name": "api", "url": "https://93.184.216.34/b"}]})
    assert duplicate.status_code == 422, duplicate.text
    assert duplicate.json()["error"]["code"] == "duplicate_endpoint"


def fan_out(cell: Cell) -> None:
    async def run() -> None:
        async with guarded_client(allow_private=True) as http:
            await Relay(cell.pool, http, RelayConfig()).fan_out()

    asyncio.run(run())
