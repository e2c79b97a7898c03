"""The cell's side of an online tenant move, on real cell databases (issue #7).

Two cell databases on one Postgres play source and target; the tests drive
them through the admin API as the operator does: move-out, pages of rows,
rounds of changes, freeze, the last changes, checksums, activate, finish.
The fence (migration 0006) is checked where it matters: a stale worker's
writes after the freeze, batch statements with a frozen tenant present, the
freeze waiting for a writer that passed the check. The pure decisions of
``moves`` are tested at the end, without a database.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cellapi import Cell
from cellfixtures import create_cell_database, fetch, write
from cellplane_cells import jobqueue, moves
from cellplane_cells.dispatch import dispatch_due, prune_runs
from cellplane_cells.errors import ConflictError, NotFoundError, TenantMovingError
from cellplane_cells.queries import query

MOVE = "move-1"


@pytest.fixture
def source(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


@pytest.fixture
def target(cell_postgres: Any) -> Iterator[Cell]:
    conninfo = create_cell_database(cell_postgres.postgres["cell"], f"target_{uuid.uuid4().hex[:12]}")
    c = Cell(conninfo)
    yield c
    c.close()


def ok(answer: Any, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json() if status != 204 else None


def start(source: Cell, tenant: str = "acme", move_id: str = MOVE) -> dict[str, Any]:
    result: dict[str, Any] = ok(source.admin.post(f"/admin/v1/tenants/{tenant}/move-out",
                                                   json={"move_id": move_id}))
    return result


def copy_rows(source: Cell, target: Cell, tenant: str = "acme", *, epoch: int = 2,
              limit: int = 3, move_id: str = MOVE) -> dict[str, int]:
    """Every table of the scope, page by page, as the operator copies it."""
    copied: dict[str, int] = {}
    for table in moves.SCOPE_TABLES:
        after: str | None = None
        while True:
            params = {"table": table, "limit": limit, **({"after": after} if after else {})}
            page = ok(source.admin.get(f"/admin/v1/tenants/{tenant}/move-out/rows", params=params))
            if page["rows"]:
                ok(target.admin.post(f"/admin/v1/tenants/{tenant}/move-in", json={
                    "move_id": move_id, "epoch": epoch, "rows": {table: page["rows"]}}))
                copied[table] = copied.get(table, 0) + len(page["rows"])
            after = page["next"]
            if after is None:
                break
    return copied


def copy_changes(source: Cell, target: Cell, after: int, tenant: str = "acme", *, epoch: int = 2,
                 limit: int = 5, move_id: str = MOVE) -> int:
    """Rounds of changes until none is pending; the cursor to go on from."""
    while True:
        delta = ok(source.admin.get(f"/admin/v1/tenants/{tenant}/move-out/changes",
                                    params={"after": after, "limit": limit}))
        if delta["rows"] or delta["deletes"]:
            ok(target.admin.post(f"/admin/v1/tenants/{tenant}/move-in", json={
                "move_id": move_id, "epoch": epoch, "rows": delta["rows"],
                "deletes": delta["deletes"]}))
        assert delta["last_seq"] >= after
        after = delta["last_seq"]
        if delta["pending"] == 0:
            return after


def sums(cell: Cell, tenant: str = "acme") -> dict[str, Any]:
    result: dict[str, Any] = ok(cell.admin.get(f"/admin/v1/tenants/{tenant}/checksums"))["tables"]
    return result


def claim(cell: Cell, tenant: str, batch: int = 10) -> list[jobqueue.ClaimedJob]:
    with cell.pool.connection() as conn:
        return [j for j in jobqueue.claim(conn, worker="w", batch=batch, lease_seconds=60)
                if j.tenant_id == tenant]


def freeze(cell: Cell, tenant: str = "acme", epoch: int = 2, move_id: str = MOVE) -> dict[str, Any]:
    result: dict[str, Any] = ok(cell.admin.post(f"/admin/v1/tenants/{tenant}/move-out:freeze",
                                                json={"move_id": move_id, "epoch": epoch}))
    return result


def with_webhook(cell: Cell, tenant: str) -> None:
    ok(cell.admin.put(f"/admin/v1/tenants/{tenant}/webhooks",
                      json={"url": f"http://127.0.0.1:9/{tenant}", "secret": "s" * 16}))


def test_online_copy_under_writes_then_freeze_gives_equal_checksums(source: Cell, target: Cell) -> None:
    acme = source.tenant("acme")
    bob = source.tenant("bob")
    with_webhook(source, "acme")
    for i in range(8):
        ok(source.submit(acme, f"k{i}", estimate=10, steps=2), 202)
    ok(source.submit(bob, "b0"), 202)

    started = start(source)
    assert started["move_id"] == MOVE
    assert started["tables"]["jobs"] == 8 and started["tables"]["steps"] == 16
    assert started["tables"]["tenant"] == 1 and started["tables"]["outbox"] == 8

    copied = copy_rows(source, target)
    assert copied["jobs"] == 8 and copied["steps"] == 16 and copied["tenant"] == 1
    # The target's copy is frozen: no claim, no key.
    assert fetch(target.conninfo, "SELECT state, epoch, move_id FROM tenants") == [("frozen", 2, MOVE)]
    assert claim(target, "acme") == []

    # The source keeps serving while the copy goes on: new jobs, claims,
    # a completion, a cancellation, the relay's fan-out.
    for i in range(8, 12):
        ok(source.submit(acme, f"k{i}", estimate=10, steps=2), 202)
    running = claim(source, "acme")
    with source.pool.connection() as conn:
        assert jobqueue.save_step(conn, running[0], step=1, result={"ok": 1})
        assert jobqueue.complete(conn, running[0], cost=3)
        conn.execute(query("fan_out_events"), {"batch": 1000})
    queued = fetch(source.conninfo, "SELECT job_id FROM jobs WHERE tenant_id = 'acme' AND status = 'queued'"
                   " ORDER BY created_at LIMIT 1")[0][0]
    ok(source.api.post(f"/v1/jobs/{queued}:cancel", headers=acme))
    after = copy_changes(source, target, 0)

    # More writes after a round, then the cutover.
    ok(source.submit(acme, "k12", estimate=10), 202)
    again = claim(source, "acme")
    frozen = freeze(source)
    assert frozen["last_seq"] > after
    refused = source.submit(acme, "k13")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "tenant_moving"
    after = copy_changes(source, target, after)

    theirs, ours = sums(source), sums(target)
    assert theirs == ours
    assert theirs["jobs"]["rows"] == 11 and theirs["steps"]["rows"] > 0 and theirs["ledger"]["rows"] == 11
    assert theirs["outbox"]["rows"] > 0 and theirs["webhooks"]["rows"] == 1
    # Jobs running in the source at the freeze are queued in the target, from their saved steps.
    still_running = {str(j.job_id) for j in running[1:] + again}
    assert still_running
    assert {str(r[0]): r[1] for r in fetch(
        target.conninfo, "SELECT job_id, status FROM jobs WHERE job_id = ANY(%s::uuid[])",
        list(still_running))} == {j: "queued" for j in still_running}
    # The finished job was carried with its final status; the wallet as it is.
    assert fetch(target.conninfo, "SELECT status FROM jobs WHERE job_id = %s",
                 running[0].job_id) == [("succeeded",)]
    assert fetch(target.conninfo, "SELECT available, reserved FROM wallets") == fetch(
        source.conninfo, "SELECT available, reserved FROM wallets WHERE tenant_id = 'acme'")

    # The target starts; the source keeps its rows read-only.
    ok(target.admin.post("/admin/v1/tenants/acme/move-in:activate", json={"move_id": MOVE}))
    ok(target.admin.post("/admin/v1/tenants/acme/move-in:activate", json={"move_id": MOVE}))
    assert {j.job_id for j in claim(target, "acme", batch=1)} <= {uuid.UUID(j) for j in still_running} | set(
        uuid.UUID(str(r[0])) for r in fetch(target.conninfo, "SELECT job_id FROM jobs"))
    ok(target.submit(acme, "k13"), 202)
    replay = target.submit(acme, "k0", estimate=10, steps=2)
    assert replay.status_code == 202 and replay.headers.get("Idempotent-Replayed") == "true"

    ok(source.admin.post("/admin/v1/tenants/acme/move-out:finish",
                         json={"move_id": MOVE, "retain_seconds": 3600}))
    ok(source.admin.post("/admin/v1/tenants/acme/move-out:finish",
                         json={"move_id": MOVE, "retain_seconds": 3600}))
    assert fetch(source.conninfo, "SELECT state, capturing FROM tenants WHERE tenant_id = 'acme'") == [
        ("moved", False)]
    assert fetch(source.conninfo, "SELECT count(*) FROM tenant_changes") == [(0,)]
    moved = source.api.get("/v1/jobs", headers=acme)
    assert moved.status_code == 503 and moved.json()["error"]["code"] == "tenant_moved"
    assert moved.headers["Retry-After"] == "1"
    ok(source.submit(bob, "b1"), 202)


def test_a_stale_workers_writes_after_the_freeze_are_refused_and_other_tenants_go_on(source: Cell) -> None:
    acme = source.tenant("acme")
    bob = source.tenant("bob")
    ok(source.submit(acme, "a", steps=2), 202)
    ok(source.submit(bob, "b", steps=2), 202)
    with source.pool.connection() as conn:
        claimed = {j.tenant_id: j for j in jobqueue.claim(conn, worker="w", batch=10, lease_seconds=60)}
    mine, theirs = claimed["acme"], claimed["bob"]
    start(source)
    freeze(source, epoch=7)
    with source.pool.connection() as conn:
        # The worker resumes (as after a SIGSTOP) with its claim: every write fails.
        with pytest.raises(TenantMovingError, match="acme is frozen under tenant epoch 7"):
            jobqueue.save_step(conn, mine, step=1, result={"late": True})
        with pytest.raises(TenantMovingError):
            jobqueue.complete(conn, mine, cost=1)
        with pytest.raises(TenantMovingError):
            jobqueue.heartbeat(conn, mine, lease_seconds=60)
        with pytest.raises(TenantMovingError):
            jobqueue.release(conn, mine, permanent=True, delay_seconds=0, error="x", error_code="x")
        # Another tenant's worker carries on.
        assert jobqueue.save_step(conn, theirs, step=1, result={"ok": 1})
        assert jobqueue.complete(conn, theirs, cost=1)
    assert fetch(source.conninfo, "SELECT status FROM job_steps WHERE job_id = %s ORDER BY step",
                 mine.job_id) == [("pending",), ("pending",)]
    assert fetch(source.conninfo, "SELECT status FROM jobs WHERE job_id = %s", mine.job_id) == [("running",)]
    # Any writer, whatever the path, is refused with the fence's SQLSTATE.
    with pytest.raises(psycopg.Error) as refused:
        write(source.conninfo, "UPDATE wallets SET available = 0 WHERE tenant_id = 'acme'")
    assert refused.value.sqlstate == "CPT01"
    answer = source.admin.post("/admin/v1/tenants/acme/wallet:credit", json={"amount": 5})
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "tenant_moving"
    # Reading still works, for the tenant too.
    assert source.api.get("/v1/jobs", headers=acme).status_code == 200

    # A cutover that failed verification: the tenant serves here again.
    ok(source.admin.post("/admin/v1/tenants/acme/move-out:unfreeze", json={"move_id": MOVE, "epoch": 1}))
    assert fetch(source.conninfo, "SELECT state, epoch, capturing FROM tenants WHERE tenant_id = 'acme'") == [
        ("active", 1, True)]
    with source.pool.connection() as conn:
        assert jobqueue.save_step(conn, mine, step=1, result={"ok": 2})
    ok(source.submit(acme, "c"), 202)


def test_batch_statements_pass_a_frozen_tenant_by(source: Cell) -> None:
    for tenant in ("acme", "bob"):
        source.tenant(tenant)
        with_webhook(source, tenant)
    with source.pool.connection() as conn:
        for tenant in ("acme", "bob"):
            conn.execute("INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,"
                         " max_attempts, estimate, expires_at) VALUES (%s, %s, 'queued', 'default', 1,"
                         " '{}', 5, 0, now() - interval '1 s')", (uuid.uuid4(), tenant))
            conn.execute("INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,"
                         " max_attempts, estimate, claimed_by, lease_until) VALUES (%s, %s, 'running',"
                         " 'default', 1, '{}', 5, 0, 'w', now() - interval '1 s')", (uuid.uuid4(), tenant))
            conn.execute("UPDATE tenants SET running = 1 WHERE tenant_id = %s", (tenant,))
            conn.execute("INSERT INTO outbox (event_id, tenant_id, kind, payload) VALUES"
                         " (gen_random_uuid(), %s, 'job.accepted', '{}')", (tenant,))
    # acme's event has a delivery in flight whose lease ran out.
    write(source.conninfo, "INSERT INTO deliveries (event_id, endpoint_id, status, attempts,"
                           " leased_until, leased_by) SELECT o.event_id, w.endpoint_id, 'pending', 1,"
                           " now() - interval '1 s', 'r' FROM outbox o JOIN webhook_endpoints w"
                           " USING (tenant_id) WHERE o.tenant_id = 'acme'")
    start(source)
    freeze(source)
    with source.pool.connection() as conn:
        assert [r["tenant_id"] for r in jobqueue.reap(conn)] == ["bob"]
        assert jobqueue.expire_queued(conn) == 1
        fanned = conn.execute(query("fan_out_events"), {"batch": 100}).fetchone()
        # bob's own event and the one of its expired job; acme's waits.
        assert fanned is not None and fanned[0] == 2
        write(source.conninfo, "UPDATE deliveries d SET leased_until = now() - interval '1 s',"
                               " leased_by = 'r' FROM outbox o WHERE o.event_id = d.event_id"
                               " AND o.tenant_id = 'bob'")
        lost = conn.execute(query("reap_lost_deliveries"), {"batch": 100, "max_attempts": 5}).fetchall()
        assert len(lost) == 2
        due = conn.execute(query("lock_due_endpoints"), {"batch": 100}).fetchall()
        assert [r[0] for r in due] == [r[0] for r in fetch(
            source.conninfo, "SELECT endpoint_id FROM webhook_endpoints WHERE tenant_id = 'bob'")]
    assert fetch(source.conninfo, "SELECT status, count(*) FROM jobs WHERE tenant_id = 'acme'"
                                  " GROUP BY status ORDER BY 1") == [("queued", 1), ("running", 1)]
    assert fetch(source.conninfo, "SELECT relayed_at IS NULL FROM outbox WHERE tenant_id = 'acme'") == [(True,)]
    assert fetch(source.conninfo, "SELECT d.leased_by FROM deliveries d JOIN outbox o USING (event_id)"
                                  " WHERE o.tenant_id = 'acme'") == [("r",)]


def test_the_freeze_waits_for_a_writer_that_passed_the_fence(source: Cell) -> None:
    acme = source.tenant("acme")
    del acme
    start(source)
    writer = psycopg.connect(source.conninfo)
    writer.execute("SET cellplane.epoch = '1'")
    writer.commit()
    writer.execute("UPDATE wallets SET available = available + 1 WHERE tenant_id = 'acme'")
    done = threading.Event()

    def freezer() -> None:
        freeze(source)
        done.set()

    thread = threading.Thread(target=freezer)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set(), "the freeze must wait for the writer that passed the fence"
    writer.commit()
    thread.join(10)
    assert done.is_set()
    writer.close()
    assert fetch(source.conninfo, "SELECT available FROM wallets WHERE tenant_id = 'acme'") == [(1_000_001,)]
    # The write was captured, before the freeze's last sequence number.
    assert fetch(source.conninfo, "SELECT kind FROM tenant_changes WHERE tenant_id = 'acme'") == [("wallet",)]


def test_move_in_refuses_an_active_tenant_and_replaces_a_moved_copy(source: Cell, target: Cell) -> None:
    source.tenant("acme")
    start(source)
    page = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows", params={"table": "tenant"}))
    assert page["next"] is None and len(page["rows"]) == 1
    batch = {"move_id": MOVE, "epoch": 2, "rows": {"tenant": page["rows"]}}

    target.tenant("acme")
    refused = target.admin.post("/admin/v1/tenants/acme/move-in", json=batch)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "tenant_exists"
    assert target.admin.delete("/admin/v1/tenants/acme/move-in",
                               params={"move_id": MOVE}).status_code == 409

    # A copy left by an earlier move out of the target: purged, then created.
    write(target.conninfo, "UPDATE tenants SET state = 'moved', purge_after = now() + interval '1 d'")
    no_tenant = target.admin.post("/admin/v1/tenants/acme/move-in",
                                  json={"move_id": MOVE, "epoch": 2, "rows": {}})
    assert no_tenant.status_code == 409 and no_tenant.json()["error"]["code"] == "invalid_bundle"
    ok(target.admin.post("/admin/v1/tenants/acme/move-in", json=batch))
    assert fetch(target.conninfo, "SELECT state, epoch, move_id, running FROM tenants") == [
        ("frozen", 2, MOVE, 0)]
    assert fetch(target.conninfo, "SELECT count(*) FROM targets") == [(0,)]
    # Another move's batch finds this move's copy.
    other = target.admin.post("/admin/v1/tenants/acme/move-in", json={**batch, "move_id": "move-2"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "tenant_exists"


def test_move_in_takes_the_quota_from_a_source_before_the_quotas_rename(
        source: Cell, target: Cell) -> None:
    source.tenant("acme", max_running_jobs=7)
    start(source)
    page = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows", params={"table": "tenant"}))
    # A source cell before migration 0012 sends the column under its former name.
    row = {k: v for k, v in page["rows"][0].items() if k != "max_running_jobs"}
    former = {**row, "max_running": page["rows"][0]["max_running_jobs"]}
    ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"tenant": [former]}}))
    assert fetch(target.conninfo, "SELECT max_running_jobs FROM tenants") == [(7,)]
    # A quota changed at the source meanwhile comes as the changed row, named the same way.
    ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"tenant": [{**former, "max_running": 4}]}}))
    assert fetch(target.conninfo, "SELECT max_running_jobs FROM tenants") == [(4,)]


def test_the_strict_allowance_moves_and_a_change_of_it_alone_is_captured(
        source: Cell, target: Cell) -> None:
    source.tenant("acme", strict_schedules=3)
    start(source)
    [row] = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows",
                                params={"table": "tenant"}))["rows"]
    ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"tenant": [row]}}))
    assert fetch(target.conninfo, "SELECT strict_schedules FROM tenants") == [(3,)]
    # Only the allowance changes at the source: the capture (0014) still sends the row.
    ok(source.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "strict_schedules": 1}))
    delta = ok(source.admin.get("/admin/v1/tenants/acme/move-out/changes"))
    assert [r["strict_schedules"] for r in delta["rows"]["tenant"]] == [1]
    ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"tenant": delta["rows"]["tenant"]}}))
    assert fetch(target.conninfo, "SELECT strict_schedules FROM tenants") == [(1,)]
    # A source before 0014 sends no allowance: unknown here, so the plan's default applies.
    older = {k: v for k, v in row.items() if k != "strict_schedules"}
    ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"tenant": [older]}}))
    assert fetch(target.conninfo, "SELECT strict_schedules FROM tenants") == [(None,)]


def test_aborts_remove_the_targets_copy_and_leave_the_source_untouched(source: Cell, target: Cell) -> None:
    acme = source.tenant("acme")
    for i in range(3):
        ok(source.submit(acme, f"k{i}"), 202)
    ran = create_schedule(source, acme, YEARLY, dispatch_window_seconds=0)
    make_due(source, ran)
    assert dispatch(source) == 1
    before = fetch(source.conninfo, "SELECT to_jsonb(j)::text FROM jobs j ORDER BY job_id")
    schedules_before = schedule_rows(source)
    start(source)
    copy_rows(source, target)
    freeze(source)
    assert schedule_rows(target) == schedules_before

    ok(target.admin.delete("/admin/v1/tenants/acme/move-in", params={"move_id": MOVE}), 204)
    ok(target.admin.delete("/admin/v1/tenants/acme/move-in", params={"move_id": MOVE}), 204)
    for table in ("tenants", "jobs", "job_steps", "ledger", "wallets", "outbox", "idempotency_keys",
                  "schedules", "schedule_runs"):
        assert fetch(target.conninfo, f"SELECT count(*) FROM {table}") == [(0,)], table

    ok(source.admin.delete("/admin/v1/tenants/acme/move-out", params={"move_id": MOVE}), 204)
    ok(source.admin.delete("/admin/v1/tenants/acme/move-out", params={"move_id": MOVE}), 204)
    ok(source.admin.delete("/admin/v1/tenants/nobody/move-out", params={"move_id": MOVE}), 204)
    assert fetch(source.conninfo, "SELECT state, capturing, move_id FROM tenants") == [("active", False, None)]
    assert fetch(source.conninfo, "SELECT count(*) FROM tenant_changes") == [(0,)]
    assert fetch(source.conninfo, "SELECT to_jsonb(j)::text FROM jobs j ORDER BY job_id") == before
    assert schedule_rows(source) == schedules_before
    ok(source.submit(acme, "k3"), 202)
    assert fetch(source.conninfo, "SELECT count(*) FROM tenant_changes") == [(0,)]


def test_a_new_move_id_starts_capture_over_and_the_same_one_keeps_it(source: Cell) -> None:
    acme = source.tenant("acme")
    start(source)
    ok(source.submit(acme, "a"), 202)
    captured = fetch(source.conninfo, "SELECT count(*) FROM tenant_changes")[0][0]
    assert captured > 0
    start(source)
    assert fetch(source.conninfo, "SELECT count(*) FROM tenant_changes")[0][0] == captured
    start(source, move_id="move-2")
    assert fetch(source.conninfo, "SELECT count(*) FROM tenant_changes") == [(0,)]
    missing = source.admin.post("/admin/v1/tenants/nobody/move-out", json={"move_id": MOVE})
    assert missing.status_code == 404
    freeze(source, move_id="move-2")
    ok(source.admin.post("/admin/v1/tenants/acme/move-out:finish",
                         json={"move_id": "move-2", "retain_seconds": 60}))
    again = source.admin.post("/admin/v1/tenants/acme/move-out", json={"move_id": "move-3"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "tenant_not_movable"


def test_finished_moves_are_purged_after_their_retention(source: Cell) -> None:
    acme = source.tenant("acme")
    bob = source.tenant("bob")
    ok(source.submit(acme, "a"), 202)
    ok(source.submit(bob, "b"), 202)
    for tenant, retain in (("acme", 0), ("bob", 3600)):
        start(source, tenant)
        freeze(source, tenant)
        ok(source.admin.post(f"/admin/v1/tenants/{tenant}/move-out:finish",
                             json={"move_id": MOVE, "retain_seconds": retain}))
    time.sleep(0.01)
    with source.pool.connection() as conn:
        assert moves.purge_expired_moves(conn) == ["acme"]
        assert moves.purge_expired_moves(conn) == []
    assert fetch(source.conninfo, "SELECT tenant_id FROM tenants") == [("bob",)]
    assert fetch(source.conninfo, "SELECT count(*) FROM jobs WHERE tenant_id = 'acme'") == [(0,)]
    # A moved tenant is purged on demand as well, past the fence.
    ok(source.admin.delete("/admin/v1/tenants/bob", params={"policy": "purge"}), 204)
    assert fetch(source.conninfo, "SELECT count(*) FROM tenants") == [(0,)]


CHANGED_IN_TARGET = {
    "steps": "UPDATE job_steps SET attempts = 9 WHERE step = 1 AND job_id = (SELECT min(job_id::text)::uuid FROM jobs)",
    "steps ": "UPDATE job_steps SET result = '{\"ok\": 2}' WHERE job_id = (SELECT min(job_id::text)::uuid FROM jobs)"
              " AND step = 1",
    "ledger": "UPDATE ledger SET amount = amount + 1 WHERE job_id = (SELECT min(job_id::text)::uuid FROM jobs)",
    "wallet": "UPDATE wallets SET reserved = reserved + 1",
    "idempotency_keys": "DELETE FROM idempotency_keys WHERE key = 'k0'",
    "jobs": "UPDATE jobs SET status = 'cancelled' WHERE job_id = (SELECT min(job_id::text)::uuid FROM jobs)",
    "jobs ": "UPDATE jobs SET payload = '{\"n\": 1}' WHERE job_id = (SELECT min(job_id::text)::uuid FROM jobs)",
    "jobs  ": "UPDATE jobs SET created_at = created_at + interval '1 microsecond'"
              " WHERE job_id = (SELECT min(job_id::text)::uuid FROM jobs)",
    "outbox": "UPDATE outbox SET payload = '{}' WHERE event_id = (SELECT min(event_id::text)::uuid FROM outbox)",
}
"""A change of one copied value in the target, by the table whose checksum must
tell (trailing spaces only keep the keys apart)."""


@pytest.mark.parametrize("table, change", list(CHANGED_IN_TARGET.items()), ids=lambda v: v.strip()[:40])
def test_checksums_differ_when_a_row_differs(source: Cell, target: Cell, table: str, change: str) -> None:
    acme = source.tenant("acme")
    for i in range(4):
        ok(source.submit(acme, f"k{i}", estimate=5, steps=2), 202)
    with source.pool.connection() as conn:
        # One step with a saved result, so that a changed result differs.
        job = claim(source, "acme", batch=1)[0]
        assert jobqueue.save_step(conn, job, step=1, result={"ok": 1})
    start(source)
    copy_rows(source, target)
    freeze(source)
    theirs = sums(source)
    assert theirs == sums(target)
    assert all(theirs[t]["rows"] > 0 for t in ("jobs", "steps", "ledger", "wallet", "idempotency_keys",
                                               "outbox"))
    write(target.conninfo, f"SELECT set_config('cellplane.tenant_admin', 'on', false); {change}")
    ours = sums(target)
    # A job out of the scope takes its steps and ledger rows out with it.
    expected = {"jobs", "steps", "ledger"} if "status" in change else {table.strip()}
    assert {t for t in theirs if theirs[t] != ours[t]} == expected


def test_checksums_normalise_what_the_target_owns(source: Cell, target: Cell) -> None:
    """A running job is queued there, with its own ledger entry ids and endpoint ids."""
    acme = source.tenant("acme")
    with_webhook(source, "acme")
    for i in range(3):
        ok(source.submit(acme, f"k{i}", estimate=5, steps=2), 202)
    claim(source, "acme", batch=1)
    # Ids the target will not share.
    write(target.conninfo, "SELECT setval('ledger_entry_id_seq', 1000); SELECT setval("
                           "'webhook_endpoints_endpoint_id_seq', 1000)")
    start(source)
    copy_rows(source, target)
    freeze(source)
    assert fetch(source.conninfo, "SELECT count(*) FROM jobs WHERE status = 'running'") == [(1,)]
    assert fetch(target.conninfo, "SELECT count(*) FROM jobs WHERE status = 'running'") == [(0,)]
    assert sums(source) == sums(target)


def test_steps_and_ledger_pages_go_by_blocks_of_jobs(source: Cell) -> None:
    acme = source.tenant("acme")
    for i in range(7):
        ok(source.submit(acme, f"k{i}", steps=3), 202)
    start(source)
    jobs_order = [str(r[0]) for r in fetch(source.conninfo, "SELECT job_id FROM jobs ORDER BY created_at, job_id")]
    for table, per_job in (("steps", 3), ("ledger", 1)):
        seen: list[tuple[str, int]] = []
        after: str | None = None
        pages = 0
        while True:
            params = {"table": table, "limit": 4, **({"after": after} if after else {})}
            page = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows", params=params))
            pages += 1
            # At most the limit less one, plus every row of the last job.
            assert len(page["rows"]) <= 4 - 1 + per_job
            seen += [(r["job_id"], r.get("step", r.get("entry_id"))) for r in page["rows"]]
            after = page["next"]
            if after is None:
                break
        assert len(seen) == len(set(seen)) == 7 * per_job, table
        # In the jobs' keyset order, a job's rows together.
        assert [j for j, _ in seen] == [j for j in jobs_order for _ in range(per_job)]
        assert pages > 1


def test_changes_send_deletes_for_rows_gone_or_delivered(source: Cell) -> None:
    source.tenant("acme")
    with_webhook(source, "acme")
    start(source)
    ok(source.admin.put("/admin/v1/tenants/acme/targets", json={"name": "extra", "url": "http://127.0.0.1:9/x"}),
       204)
    write(source.conninfo, "DELETE FROM targets WHERE name = 'extra'")
    write(source.conninfo, "INSERT INTO outbox (event_id, tenant_id, kind, payload, relayed_at)"
                           " VALUES (gen_random_uuid(), 'acme', 'job.accepted', '{}', now())")
    ok(source.admin.put("/admin/v1/tenants/acme", json={"plan": "enterprise"}))
    delta = ok(source.admin.get("/admin/v1/tenants/acme/move-out/changes"))
    assert delta["deletes"]["targets"] == ["extra"]
    assert len(delta["deletes"]["outbox"]) == 1
    assert [r["plan"] for r in delta["rows"]["tenant"]] == ["enterprise"]
    assert delta["pending"] == 0 and delta["last_seq"] > 0
    empty = ok(source.admin.get("/admin/v1/tenants/acme/move-out/changes",
                                params={"after": delta["last_seq"]}))
    assert empty == {"rows": {}, "deletes": {}, "last_seq": delta["last_seq"], "pending": 0}


def test_move_in_bodies_may_be_larger_than_other_admin_bodies(target: Cell) -> None:
    big = {"move_id": MOVE, "epoch": 2, "rows": {"jobs": [{"tenant_id": "acme", "pad": "x" * 2_000_000}]}}
    answer = target.admin.post("/admin/v1/tenants/acme/move-in", json=big)
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "invalid_bundle"
    too_big = target.admin.put("/admin/v1/tenants/acme", content=b"x" * 2_000_000,
                               headers={"Content-Type": "application/json"})
    assert too_big.status_code == 413


# --- the pure decisions ----------------------------------------------------------------------

S = moves.TenantMoveState


def test_decisions_of_the_source() -> None:
    with pytest.raises(NotFoundError):
        moves.plan_move_out(None, MOVE)
    assert moves.plan_move_out(S("active", None), MOVE) is False
    assert moves.plan_move_out(S("active", MOVE), MOVE) is True
    assert moves.plan_move_out(S("active", "old"), MOVE) is False
    for state in ("moved", "retired"):
        with pytest.raises(ConflictError, match="cannot move out"):
            moves.plan_move_out(S(state, MOVE), MOVE)
    with pytest.raises(ConflictError):
        moves.plan_move_out(S("frozen", "other"), MOVE)
    assert moves.plan_freeze(S("active", MOVE), MOVE) is True
    assert moves.plan_freeze(S("frozen", MOVE), MOVE) is False
    with pytest.raises(ConflictError) as mismatch:
        moves.plan_freeze(S("active", None), MOVE)
    assert mismatch.value.code == "move_mismatch"
    assert moves.plan_unfreeze(S("frozen", MOVE), MOVE) is True
    assert moves.plan_unfreeze(S("active", MOVE), MOVE) is False
    assert moves.plan_finish(S("frozen", MOVE), MOVE) is True
    assert moves.plan_finish(S("moved", MOVE), MOVE) is False
    # The freeze lost with a primary that fell before the commit: fenced now.
    assert moves.plan_finish(S("active", MOVE), MOVE) is True
    for state in ("paused", "retired"):
        with pytest.raises(ConflictError):
            moves.plan_finish(S(state, MOVE), MOVE)


def test_decisions_of_the_target() -> None:
    plan = moves.plan_move_in
    assert plan(None, MOVE, has_tenant_row=True) is moves.MoveInAction.CREATE
    assert plan(S("moved", "old"), MOVE, has_tenant_row=True) is moves.MoveInAction.REPLACE
    assert plan(S("retired", None), MOVE, has_tenant_row=True) is moves.MoveInAction.REPLACE
    assert plan(S("frozen", MOVE), MOVE, has_tenant_row=False) is moves.MoveInAction.APPLY
    for existing in (S("active", MOVE), S("frozen", "other"), S("paused", None)):
        with pytest.raises(ConflictError) as exists:
            plan(existing, MOVE, has_tenant_row=True)
        assert exists.value.code == "tenant_exists"
    with pytest.raises(ConflictError) as bundle:
        plan(None, MOVE, has_tenant_row=False)
    assert bundle.value.code == "invalid_bundle"
    assert moves.plan_activate(S("frozen", MOVE), MOVE) is True
    assert moves.plan_activate(S("active", MOVE), MOVE) is False


def test_cursors_and_change_deduplication() -> None:
    key = ["2024-01-01T00:00:00.123456+00:00", str(uuid.UUID(int=5)), 3]
    assert moves.decode_cursor(moves.encode_cursor(key)) == key
    assert moves.decode_cursor(None) is None and moves.decode_cursor("") is None
    with pytest.raises(Exception, match="cursor"):
        moves.decode_cursor("not base64 json!")
    entries = [(1, "jobs", "a"), (2, "steps", "a"), (3, "jobs", "b"), (4, "jobs", "a")]
    assert moves.dedupe_changes(entries) == {"jobs": ["a", "b"], "steps": ["a"]}


def test_steps_of_a_job_submitted_after_the_jobs_pages_come_with_its_change(
        source: Cell, target: Cell) -> None:
    """The bulk copy pages jobs, then steps: a job submitted in between has its steps in
    the steps pages but not its row in the target yet. Those steps are left out, not
    refused (a refusal stops every copy under load), and arrive with the job's change."""
    acme = source.tenant("acme")
    ok(source.submit(acme, "early", steps=2), 202)
    start(source)
    for table in moves.SCOPE_TABLES[:moves.SCOPE_TABLES.index("steps")]:
        page = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows",
                                   params={"table": table, "limit": 100}))
        ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
            "move_id": MOVE, "epoch": 2, "rows": {table: page["rows"]}}))
    late = ok(source.submit(acme, "late", steps=2), 202)["job_id"]
    steps = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows",
                                params={"table": "steps", "limit": 100}))["rows"]
    assert {s["job_id"] for s in steps} >= {late}
    applied = ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
        "move_id": MOVE, "epoch": 2, "rows": {"steps": steps}}))["applied"]
    assert applied["steps"] == 2, applied
    for table in moves.SCOPE_TABLES[moves.SCOPE_TABLES.index("steps") + 1:]:
        page = ok(source.admin.get("/admin/v1/tenants/acme/move-out/rows",
                                   params={"table": table, "limit": 100}))
        if page["rows"]:
            ok(target.admin.post("/admin/v1/tenants/acme/move-in", json={
                "move_id": MOVE, "epoch": 2, "rows": {table: page["rows"]}}))
    copy_changes(source, target, 0)
    freeze(source)
    assert fetch(target.conninfo, "SELECT count(*) FROM job_steps WHERE job_id = %s",
                 late) == [(2,)]
    assert sums(source) == sums(target)


def test_a_freeze_that_cannot_take_the_tenants_lock_within_its_time_gives_up(source: Cell) -> None:
    """The cutover's deadline reaches the database: a writer holding the tenant's lock
    makes the freeze wait, but never past what is left of the pause budget (issue #18)."""
    source.tenant("acme")
    start(source)
    writer = psycopg.connect(source.conninfo)
    writer.execute("SET cellplane.epoch = '1'")
    writer.commit()
    writer.execute("UPDATE wallets SET available = available + 1 WHERE tenant_id = 'acme'")
    try:
        began = time.monotonic()
        answer = source.admin.post("/admin/v1/tenants/acme/move-out:freeze",
                                   json={"move_id": MOVE, "epoch": 2, "within_ms": 300})
        took = time.monotonic() - began
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "freeze_timeout"
        assert took < 5, took  # the lock wait ended at 0.3 s, not with the writer
        # Nothing changed: the tenant serves on, and the writer commits.
        assert fetch(source.conninfo, "SELECT state, epoch FROM tenants WHERE tenant_id = 'acme'"
                     ) == [("active", 1)]
        writer.commit()
    finally:
        writer.close()
    assert fetch(source.conninfo, "SELECT available FROM wallets WHERE tenant_id = 'acme'"
                 ) == [(1_000_001,)]
    # With the writer gone, the same freeze goes through.
    ok(source.admin.post("/admin/v1/tenants/acme/move-out:freeze",
                         json={"move_id": MOVE, "epoch": 2, "within_ms": 5000}))
    assert fetch(source.conninfo, "SELECT state FROM tenants WHERE tenant_id = 'acme'"
                 ) == [("frozen",)]


# --- schedules (0009, captured since 0013) ------------------------------------------------------

YEARLY = {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"}
"""A cron far from its next time: a test makes an occurrence due with ``make_due``."""


def create_schedule(cell: Cell, auth: dict[str, str], schedule: dict[str, str], **body: Any) -> str:
    created = ok(cell.api.post("/v1/schedules", headers=auth, json={
        "schedule": schedule, "target": "default", "payload": {"n": 1}, **body}), 201)
    return str(created["schedule_id"])


def make_due(cell: Cell, schedule_id: str) -> None:
    """A yearly schedule's pending occurrence is this year's, as after an outage: one run
    is due (RUN_ONCE), and the next is a year away."""
    write(cell.conninfo, "UPDATE schedules SET next_at = date_trunc('year', now() AT TIME ZONE 'UTC')"
                         " AT TIME ZONE 'UTC', dispatch_at = (date_trunc('year', now() AT TIME ZONE"
                         " 'UTC') AT TIME ZONE 'UTC') + dispatch_offset WHERE schedule_id = %s",
          schedule_id)


def dispatch(cell: Cell) -> int:
    """One dispatcher pass; the jobs it made."""
    with cell.pool.connection() as conn:
        return dispatch_due(conn, batch=100).jobs


def schedule_rows(cell: Cell, tenant: str = "acme") -> list[tuple[Any, ...]]:
    """Every column of the tenant's schedules and runs, as JSON, in key order."""
    return fetch(cell.conninfo,
                 "SELECT 'schedule', row_to_json(s)::jsonb FROM schedules s WHERE tenant_id = %s"
                 " UNION ALL SELECT 'run', row_to_json(r)::jsonb FROM schedule_runs r"
                 " WHERE tenant_id = %s ORDER BY 1, 2", tenant, tenant)


def as_move_admin(cell: Cell, sql: str, *params: Any) -> None:
    """A write past the tenant fence (0006), as the move's own path makes them."""
    with psycopg.connect(cell.conninfo, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT set_config('cellplane.epoch', '1', true),"
                     " set_config('cellplane.tenant_admin', 'on', true)")
        conn.execute(sql.encode(), params)


def test_schedules_move_with_their_next_times_states_and_runs(source: Cell, target: Cell) -> None:
    acme = source.tenant("acme")
    bob = source.tenant("bob")
    once = create_schedule(source, acme, {"type": "ONCE", "run_at": "2031-06-01T09:00:00",
                                          "time_zone": "Europe/Berlin"})
    cron = create_schedule(source, acme, {"type": "CRON", "cron": "*/5 * * * *",
                                          "time_zone": "America/New_York"}, misfire_policy="SKIP")
    paused = create_schedule(source, acme, {"type": "CRON", "cron": "0 8 * * MON",
                                            "time_zone": "Australia/Lord_Howe"}, priority="HIGH")
    ok(source.api.post(f"/v1/schedules/{paused}:pause", headers=acme))
    # An occurrence dispatched before the move, its job running in the source at the freeze.
    ran = create_schedule(source, acme, YEARLY, dispatch_window_seconds=0)
    old = create_schedule(source, acme, YEARLY, dispatch_window_seconds=0)
    bobs = create_schedule(source, bob, YEARLY, dispatch_window_seconds=0)
    for schedule_id in (ran, old, bobs):
        make_due(source, schedule_id)
    assert dispatch(source) == 3
    running = claim(source, "acme") + claim(source, "acme")  # one job of a tenant per claim
    in_flight = fetch(source.conninfo, "SELECT job_id, scheduled_for, idempotency_key FROM schedule_runs"
                                       " WHERE schedule_id = %s", ran)
    assert {j.job_id for j in running} >= {in_flight[0][0]}

    started = start(source)
    assert started["tables"]["schedules"] == 5 and started["tables"]["schedule_runs"] == 2
    copied = copy_rows(source, target, limit=2)
    assert copied["schedules"] == 5 and copied["schedule_runs"] == 2

    # Between the copy and the freeze: a schedule created and dispatched (its run
    # comes with its change, not with the pages), one updated, one cancelled, and a
    # run pruned by its retention.
    new = create_schedule(source, acme, YEARLY, dispatch_window_seconds=0)
    make_due(source, new)
    assert dispatch(source) == 1
    updated = ok(source.api.put(f"/v1/schedules/{cron}", headers=acme, json={
        "schedule": {"type": "CRON", "cron": "*/10 * * * *", "time_zone": "America/New_York"},
        "target": "default", "payload": {"n": 2}, "misfire_policy": "SKIP"}))
    ok(source.api.post(f"/v1/schedules/{once}:cancel", headers=acme))
    write(source.conninfo, "UPDATE schedule_runs SET dispatched_at = now() - interval '40 days'"
                           " WHERE schedule_id = %s", old)
    with source.pool.connection() as conn:
        assert prune_runs(conn, days=30) == 1
    after = copy_changes(source, target, 0)

    freeze(source)
    # Nothing of a frozen tenant is dispatched or pruned in the source; others go on.
    as_move_admin(source, "UPDATE schedules SET next_at = next_at - interval '1 day',"
                          " dispatch_at = dispatch_at - interval '1 day' WHERE schedule_id = %s", cron)
    assert dispatch(source) == 0
    with source.pool.connection() as conn:
        assert prune_runs(conn, days=0) == 1  # bob's run, none of acme's
    as_move_admin(source, "UPDATE schedules SET next_at = next_at + interval '1 day',"
                          " dispatch_at = dispatch_at + interval '1 day' WHERE schedule_id = %s", cron)
    after = copy_changes(source, target, after)

    theirs, ours = sums(source), sums(target)
    assert theirs == ours
    assert theirs["schedules"]["rows"] == 6 and theirs["schedule_runs"]["rows"] == 2
    # Every column alike: ids, pending occurrences, dispatch times, states, the job
    # of the latest run, create keys, times.
    assert schedule_rows(target) == schedule_rows(source)
    assert {str(r[0]): r[1] for r in fetch(target.conninfo, "SELECT schedule_id, state FROM schedules")} == {
        once: "cancelled", cron: "active", paused: "paused", ran: "active", old: "active", new: "active"}
    # The run in flight at the freeze is queued in the target under its one key.
    job_id, _, key = in_flight[0]
    assert fetch(target.conninfo, "SELECT j.status, s.idempotency_key FROM jobs j JOIN job_steps s"
                                  " USING (job_id) WHERE job_id = %s", job_id) == [("queued", key)]

    ok(target.admin.post("/admin/v1/tenants/acme/move-in:activate", json={"move_id": MOVE}))
    # Nothing is due in the target: no occurrence runs twice, none early.
    assert dispatch(target) == 0
    assert fetch(target.conninfo, "SELECT count(*) FROM jobs j JOIN schedule_runs r USING (job_id)"
                                  " WHERE r.schedule_id = %s", ran) == [(1,)]
    there = ok(target.api.get(f"/v1/schedules/{cron}", headers=acme))
    assert (there["next_run_at"], there["state"]) == (updated["next_run_at"], "active")
    history = ok(target.api.get(f"/v1/schedules/{ran}/runs", headers=acme))
    assert [r["idempotency_key"] for r in history["runs"]] == [key]

    ok(source.admin.post("/admin/v1/tenants/acme/move-out:finish",
                         json={"move_id": MOVE, "retain_seconds": 0}))
    time.sleep(0.01)
    with source.pool.connection() as conn:
        assert moves.purge_expired_moves(conn) == ["acme"]
    assert schedule_rows(source) == []
    assert fetch(source.conninfo, "SELECT count(*) FROM schedules WHERE tenant_id = 'bob'") == [(1,)]


SCHEDULE_CHANGED_IN_TARGET = {
    "schedules": "UPDATE schedules SET next_at = next_at + interval '1 s',"
                 " dispatch_at = dispatch_at + interval '1 s' WHERE kind = 'ONCE'",
    "schedules ": "UPDATE schedules SET state = 'paused' WHERE kind = 'ONCE'",
    "schedules  ": "UPDATE schedules SET dispatch_offset = dispatch_offset + interval '1 ms'"
                   " WHERE kind = 'ONCE'",
    "schedules   ": "UPDATE schedules SET last_job_id = NULL",
    "schedules    ": "UPDATE schedules SET misfire_policy = 'RUN_ALL' WHERE kind = 'ONCE'",
    "schedule_runs": "UPDATE schedule_runs SET idempotency_key = idempotency_key || 'x'",
    "schedule_runs ": "DELETE FROM schedule_runs",
}
"""A schedule or run that differs in the target, by the table whose checksum must tell."""


@pytest.mark.parametrize("table, change", list(SCHEDULE_CHANGED_IN_TARGET.items()),
                         ids=lambda v: v.strip()[:40])
def test_checksums_differ_when_a_schedule_or_run_differs(source: Cell, target: Cell, table: str,
                                                          change: str) -> None:
    acme = source.tenant("acme")
    create_schedule(source, acme, {"type": "ONCE", "run_at": "2031-06-01T09:00:00",
                                   "time_zone": "Europe/Berlin"})
    ran = create_schedule(source, acme, YEARLY, dispatch_window_seconds=0)
    make_due(source, ran)
    assert dispatch(source) == 1
    start(source)
    copy_rows(source, target)
    freeze(source)
    theirs = sums(source)
    assert theirs == sums(target)
    assert theirs["schedules"]["rows"] == 2 and theirs["schedule_runs"]["rows"] == 1
    write(target.conninfo, f"SELECT set_config('cellplane.tenant_admin', 'on', false); {change}")
    ours = sums(target)
    assert {t for t in theirs if theirs[t] != ours[t]} == {table.strip()}
