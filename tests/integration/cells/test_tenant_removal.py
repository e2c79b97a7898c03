"""A tenant leaves its cell, on a real cell database: retained (rows kept, disabled) or purged.

The purge test finds the tables to check in ``information_schema``: every
table with a ``tenant_id`` column is checked as it is, and a table without one
must say here how its rows belong to a tenant, so a table added later cannot
be forgotten by the purge or by this test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cellapi import Cell
from cellfixtures import fetch, grant, write
from cellplane_cells import jobqueue, target_limits
from cellplane_cells.domain.aimd import AimdPolicy
from cellplane_cells.domain.breaker import BreakerPolicy
from cellplane_cells.queries import query

CELL_LEVEL = {"placement_group", "schema_migrations"}
"""Tables of the cell itself, holding no tenant's rows."""
OWNED_THROUGH = {
    "job_steps": "job_steps t JOIN jobs p USING (job_id)",
    "deliveries": "deliveries t JOIN outbox p USING (event_id)",
    "delivery_attempts": "delivery_attempts t JOIN outbox p USING (event_id)",
}
"""Tables without a tenant_id column: how their rows reach the tenant (``p.tenant_id``)."""


@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


def tables(conninfo: str) -> tuple[list[str], list[str]]:
    """(tables with a tenant_id column, the other tables) of the cell's schema."""
    rows = fetch(conninfo, """
        SELECT t.table_name,
               EXISTS (SELECT 1 FROM information_schema.columns c
                        WHERE c.table_schema = t.table_schema AND c.table_name = t.table_name
                          AND c.column_name = 'tenant_id')
          FROM information_schema.tables t
         WHERE t.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
         ORDER BY 1""")
    return [name for name, has in rows if has], [name for name, has in rows if not has]


def owned_rows(conninfo: str, table: str, tenant_id: str) -> list[str]:
    """Every row of ``table`` that belongs to the tenant, as JSON text, in a stable order."""
    source = OWNED_THROUGH.get(table, f"{table} t")
    owner = "p.tenant_id" if table in OWNED_THROUGH else "t.tenant_id"
    return sorted(row[0] for row in fetch(
        conninfo, f"SELECT to_jsonb(t)::text FROM {source} WHERE {owner} = %s", tenant_id))


def count(conninfo: str, table: str) -> int:
    return int(fetch(conninfo, f"SELECT count(*) FROM {table}")[0][0])


def populate(cell: Cell, tenant_id: str) -> dict[str, str]:
    """A tenant with a row in every table: quotas, bucket, wallet, target, webhook, jobs
    queued, running (one calling its target) and finished, their steps, ledger, keys, events, deliveries, attempts,
    a schedule and a run of it."""
    auth = cell.tenant(tenant_id, burst=20)
    # A move out under way: every later write of the tenant is captured.
    assert cell.admin.post(f"/admin/v1/tenants/{tenant_id}/move-out",
                           json={"move_id": "m"}).status_code == 200
    hook = cell.admin.put(f"/admin/v1/tenants/{tenant_id}/webhooks",
                          json={"url": f"http://127.0.0.1:9/{tenant_id}", "secret": "s" * 16})
    assert hook.status_code == 200, hook.text
    for key in ("a", "b", "c"):
        assert cell.submit(auth, key, estimate=10).status_code == 202
    with cell.pool.connection() as conn:
        done = [j for j in jobqueue.claim(conn, worker="w", batch=50, lease_seconds=60)
                if j.tenant_id == tenant_id]
        assert jobqueue.complete(conn, done[0], cost=5)
        # Another one stays running, calling its target: a purge must not wait for it.
        running = [j for j in jobqueue.claim(conn, worker="w", batch=50, lease_seconds=60)
                   if j.tenant_id == tenant_id]
        assert [j.tenant_id for j in running] == [tenant_id]
        assert isinstance(target_limits.take_slot(conn, running[0], policy=AimdPolicy(),
                                                  breaker_policy=BreakerPolicy()),
                          target_limits.Slot)
        with conn.transaction():
            conn.execute(query("fan_out_events"), {"batch": 1000})
            endpoints = [row[0] for row in conn.execute(
                "SELECT endpoint_id FROM webhook_endpoints WHERE tenant_id = %s", (tenant_id,))]
            conn.execute(query("claim_deliveries"), {
                "endpoint_ids": endpoints, "slots": [1] * len(endpoints), "relay": "r",
                "lease_seconds": 60})
    schedule = cell.api.post("/v1/schedules", headers=auth, json={
        "schedule": {"type": "CRON", "cron": "0 * * * *", "time_zone": "UTC"},
        "target": "default", "payload": {}})
    assert schedule.status_code == 201, schedule.text
    write(cell.conninfo, "INSERT INTO schedule_runs (schedule_id, scheduled_for, tenant_id, job_id,"
          " idempotency_key) SELECT %s, now(), %s, job_id, 'k' FROM jobs WHERE tenant_id = %s LIMIT 1",
          schedule.json()["schedule_id"], tenant_id, tenant_id)
    return auth


def test_purge_removes_every_row_of_the_tenant_in_every_table_and_nothing_else(cell: Cell) -> None:
    bob = populate(cell, "bob")
    acme = populate(cell, "acme")
    with_tenant_id, others = tables(cell.conninfo)
    unowned = set(others) - CELL_LEVEL - OWNED_THROUGH.keys()
    assert not unowned, f"say in OWNED_THROUGH how rows of {unowned} belong to a tenant"
    checked = with_tenant_id + sorted(OWNED_THROUGH)
    for table in checked:
        assert owned_rows(cell.conninfo, table, "acme"), f"populate() leaves {table} empty"
    bob_before = {table: owned_rows(cell.conninfo, table, "bob") for table in checked}

    answer = cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "purge"})
    assert answer.status_code == 204, answer.text

    for table in checked:
        # Everything left is bob's, unchanged, so nothing of acme's is.
        assert owned_rows(cell.conninfo, table, "bob") == bob_before[table], table
        assert count(cell.conninfo, table) == len(bob_before[table]), table
    for table in with_tenant_id:
        assert fetch(cell.conninfo, f"SELECT count(*) FROM {table} WHERE tenant_id = 'acme'") == [(0,)]
    assert cell.api.get("/v1/jobs", headers=acme).status_code == 401
    assert cell.admin.get("/admin/v1/tenants/acme").status_code == 404
    # Idempotent: the tenant is gone, which is what a repeated purge asks for.
    assert cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "purge"}).status_code == 204
    assert cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "retain"}).status_code == 204
    # The cell carries on for the others, the tenant id can be used afresh.
    assert cell.submit(bob, "d").status_code == 202
    with cell.pool.connection() as conn:
        assert [j.tenant_id for j in jobqueue.claim(conn, worker="w", batch=5, lease_seconds=60)] == ["bob"]
    assert cell.admin.put("/admin/v1/tenants/acme", json={"plan": "free"}).json()["created"] is True


def test_purge_under_a_stale_epoch_is_refused_and_deletes_nothing(cell: Cell) -> None:
    populate(cell, "acme")
    before = {table: count(cell.conninfo, table) for table in tables(cell.conninfo)[0]}
    grant(cell.conninfo, epoch=2, seconds=3600)   # another owner took the placement group
    answer = cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "purge"})
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "stale_epoch"
    assert cell.admin.delete("/admin/v1/tenants/acme",
                             params={"policy": "retain"}).json()["error"]["code"] == "stale_epoch"
    assert {table: count(cell.conninfo, table) for table in before} == before
    assert fetch(cell.conninfo, "SELECT state FROM tenants") == [("active",)]


def test_retain_keeps_the_rows_but_the_key_fails_and_no_job_is_claimed_until_a_put(cell: Cell) -> None:
    acme = cell.tenant("acme")
    bob = cell.tenant("bob")
    queued = cell.submit(acme, "a").json()["job_id"]
    with_tenant_id, _ = tables(cell.conninfo)
    kept = {t: owned_rows(cell.conninfo, t, "acme") for t in with_tenant_id if t != "tenants"}

    answer = cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "retain"})
    assert answer.status_code == 204, answer.text

    refused = cell.api.get(f"/v1/jobs/{queued}", headers=acme)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthenticated"
    assert cell.submit(acme, "b").status_code == 401
    assert cell.submit(bob, "x").status_code == 202
    with cell.pool.connection() as conn:
        assert [j.tenant_id for j in jobqueue.claim(conn, worker="w", batch=5, lease_seconds=60)] == ["bob"]
        assert jobqueue.claim(conn, worker="w", batch=5, lease_seconds=60) == []
    summary = cell.admin.get("/admin/v1/tenants/acme").json()
    assert (summary["state"], summary["queued"], summary["available"]) == ("retired", 1, 1_000_000)
    assert {t: owned_rows(cell.conninfo, t, "acme") for t in kept} == kept
    # Idempotent.
    assert cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "retain"}).status_code == 204
    assert cell.admin.get("/admin/v1/tenants/acme").json()["state"] == "retired"

    # Placed here again: active, with the same key (none is issued).
    again = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"})
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["api_key"] is None and again.json()["tenant"]["state"] == "active"
    assert cell.api.get(f"/v1/jobs/{queued}", headers=acme).status_code == 200
    with cell.pool.connection() as conn:
        claimed = jobqueue.claim(conn, worker="w", batch=5, lease_seconds=60)
    assert [str(j.job_id) for j in claimed] == [queued]


def test_a_put_does_not_wake_a_paused_or_frozen_tenant(cell: Cell) -> None:
    cell.tenant("acme")
    for state in ("paused", "frozen"):
        with cell.pool.connection() as conn:
            conn.execute(query("set_tenant_state"), {"state": state, "tenant_id": "acme"})
        cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"})
        assert cell.admin.get("/admin/v1/tenants/acme").json()["state"] == state


@pytest.mark.parametrize(("params", "headers", "status"), [
    ({}, None, 422),
    ({"policy": "forget"}, None, 422),
    ({"policy": "purge"}, {"Authorization": "Bearer not-the-admin-token"}, 401),
])
def test_removal_needs_a_policy_and_the_admin_token(cell: Cell, params: dict[str, str],
                                                    headers: dict[str, str] | None,
                                                    status: int) -> None:
    cell.tenant("acme")
    answer: Any = cell.admin.delete("/admin/v1/tenants/acme", params=params, headers=headers)
    assert answer.status_code == status and "error" in answer.json()
    assert fetch(cell.conninfo, "SELECT state FROM tenants") == [("active",)]


def test_a_running_job_of_a_purged_tenant_writes_nothing_when_it_finishes(cell: Cell) -> None:
    auth = cell.tenant("acme")
    cell.submit(auth, "a", estimate=10)
    with cell.pool.connection() as conn:
        [job] = jobqueue.claim(conn, worker="w", batch=1, lease_seconds=60)
    assert cell.admin.delete("/admin/v1/tenants/acme", params={"policy": "purge"}).status_code == 204
    with cell.pool.connection() as conn:
        assert jobqueue.heartbeat(conn, job, lease_seconds=60) is None
        assert jobqueue.complete(conn, job, cost=5) is False
    assert fetch(cell.conninfo, "SELECT count(*) FROM ledger") == [(0,)]
    assert fetch(cell.conninfo, "SELECT count(*) FROM outbox WHERE job_id = %s",
                 uuid.UUID(str(job.job_id))) == [(0,)]
