"""The admin surface on a real cell database: redrive, export/import, metrics, spend limits."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cellfixtures import create_cell_database, fetch, write
from cellplane_cells import jobqueue
from cellplane_cells.dispatch import dispatch_due
from cellplane_cells.domain.plans import PLAN_DEFAULTS, Plan

from cellapi import Cell


@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


def test_redrive_copies_dead_jobs_with_new_reservations_spaced_at_the_capped_rate(cell: Cell) -> None:
    auth = cell.tenant("acme", credit=1000, burst=20)
    ids = [cell.submit(auth, f"k{i}", estimate=100).json()["job_id"] for i in range(5)]
    write(cell.conninfo, "UPDATE jobs SET status = 'dead', finished_at = now()")
    with cell.pool.connection() as conn:
        for job_id in ids:
            jobqueue.refund(conn, uuid.UUID(job_id))
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(1000, 0)]

    answer = cell.admin.post("/admin/v1/tenants/acme/dead-letter:redrive",
                             json={"limit": 10, "per_second": 2})
    assert answer.status_code == 200, answer.text
    redriven = answer.json()["redriven"]
    assert sorted(r["dead"] for r in redriven) == sorted(ids)
    # Each copy reserved its estimate again; their due times are 0.5 s apart.
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(500, 500)]
    due = [row[0] for row in fetch(
        cell.conninfo, "SELECT extract(epoch FROM run_after - min(run_after) OVER ()) FROM jobs"
                       " WHERE redriven_from IS NOT NULL ORDER BY run_after")]
    assert [round(float(d), 2) for d in due] == [0.0, 0.5, 1.0, 1.5, 2.0]
    with cell.pool.connection() as conn:
        assert len(jobqueue.claim(conn, worker="w", batch=5, lease_seconds=60)) == 1
    # A second redrive finds nothing left to copy.
    again = cell.admin.post("/admin/v1/tenants/acme/dead-letter:redrive", json={"limit": 10})
    assert again.json()["redriven"] == []


def test_redrive_stops_when_the_wallet_runs_dry(cell: Cell) -> None:
    auth = cell.tenant("acme", credit=250, burst=20)
    for i in range(2):
        cell.submit(auth, f"k{i}", estimate=100)
    write(cell.conninfo, "UPDATE jobs SET status = 'dead', finished_at = now()")
    with cell.pool.connection() as conn:
        for (job_id,) in fetch(cell.conninfo, "SELECT job_id FROM jobs"):
            jobqueue.refund(conn, job_id)
    write(cell.conninfo, "UPDATE wallets SET available = 150")
    answer = cell.admin.post("/admin/v1/tenants/acme/dead-letter:redrive", json={"limit": 10}).json()
    assert len(answer["redriven"]) == 1 and answer["stopped_by_funds"] is True


def test_export_then_import_into_another_cell_keeps_jobs_money_and_keys(cell: Cell, cell_postgres) -> None:  # type: ignore[no-untyped-def]
    auth = cell.tenant("acme", credit=1000, burst=20)
    queued = cell.submit(auth, "a", estimate=100).json()["job_id"]
    running = cell.submit(auth, "b", estimate=200).json()["job_id"]
    with cell.pool.connection() as conn:
        claimed = jobqueue.claim(conn, worker="w", batch=1, lease_seconds=60)
        assert [str(job.job_id) for job in claimed] == [queued]
        assert jobqueue.save_step(conn, claimed[0], step=1, result={"done": 1})
    bundle = cell.admin.get("/admin/v1/tenants/acme/export").json()

    target_db = create_cell_database(cell_postgres.postgres["cell"], f"target_{uuid.uuid4().hex[:8]}")
    target = Cell(target_db)
    try:
        for _ in range(2):    # importing twice changes nothing the second time
            answer = target.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 2, "bundle": bundle})
            assert answer.status_code == 200, answer.text
        assert fetch(target_db, "SELECT job_id::text, status FROM jobs ORDER BY created_at") == [
            (queued, "queued"), (running, "queued")]
        assert fetch(target_db, "SELECT status, result FROM job_steps WHERE job_id = %s",
                     uuid.UUID(queued)) == [("succeeded", {"done": 1})]
        assert fetch(target_db, "SELECT epoch, running FROM tenants") == [(2, 0)]
        assert fetch(target_db, "SELECT available, reserved FROM wallets") == [(700, 300)]
        assert fetch(target_db, "SELECT count(*) FROM ledger") == [(2,)]
        # The same API key works there, and a resubmission is still recognised.
        replay = target.submit(auth, "a", estimate=100)
        assert replay.status_code == 202 and replay.json()["job_id"] == queued
        conflict = target.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 3, "bundle": bundle})
        assert conflict.status_code == 409
    finally:
        target.close()


def test_a_bundle_exported_before_the_quota_was_renamed_keeps_its_quota(  # type: ignore[no-untyped-def]
        cell: Cell, cell_postgres) -> None:
    cell.tenant("acme", max_running_jobs=7)
    bundle = cell.admin.get("/admin/v1/tenants/acme/export").json()
    # A cell before migration 0012 exports the column under its former name.
    bundle["tenant"]["max_running"] = bundle["tenant"].pop("max_running_jobs")

    target_db = create_cell_database(cell_postgres.postgres["cell"], f"target_{uuid.uuid4().hex[:8]}")
    target = Cell(target_db)
    try:
        answer = target.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 2, "bundle": bundle})
        assert answer.status_code == 200, answer.text
        assert fetch(target_db, "SELECT max_running_jobs FROM tenants") == [(7,)]
    finally:
        target.close()


def test_the_running_jobs_quota_may_still_be_given_by_its_former_name(cell: Cell) -> None:
    named = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "max_running_jobs": 7})
    assert named.status_code == 200, named.text
    assert named.json()["tenant"]["max_running_jobs"] == 7
    # An operator from before the rename (migration 0012) sends `max_running`.
    former = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "max_running": 3})
    assert former.status_code == 200, former.text
    assert former.json()["tenant"]["max_running_jobs"] == 3
    assert fetch(cell.conninfo, "SELECT max_running_jobs FROM tenants") == [(3,)]
    # Both names at once: refused, whatever the values, and nothing changes.
    for running, former_running in ((4, 6), (4, 4)):
        both = cell.admin.put("/admin/v1/tenants/acme", json={
            "plan": "pro", "max_running_jobs": running, "max_running": former_running})
        assert both.status_code == 422, both.text
        assert "deprecated name of max_running_jobs" in both.json()["error"]["fields"][0]["problem"]
    # The former name is held to the plan's ceiling as the new one is (pro: 50).
    assert cell.admin.put("/admin/v1/tenants/acme",
                          json={"plan": "pro", "max_running": 51}).status_code == 422
    assert fetch(cell.conninfo, "SELECT max_running_jobs FROM tenants") == [(3,)]


def test_metrics_report_queue_age_slots_and_rejections(cell: Cell) -> None:
    auth = cell.tenant("acme", burst=1)
    cell.submit(auth, "a")
    cell.submit(auth, "b")          # 429
    text = cell.admin.get("/metrics").text
    assert 'cellplane_cell_queued_jobs{tenant="acme"} 1.0' in text
    assert 'cellplane_cell_running_cap{tenant="acme"} 5.0' in text
    assert 'cellplane_cell_queue_age_seconds{tenant="acme"}' in text
    assert 'cellplane_cell_submissions_refused_total{reason="rate_limited"}' in text
    assert "cellplane_cell_writes_rejected_total" in text
    assert cell.admin.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_enterprise_daily_spend_limit_is_a_wallet_that_refills_each_day(cell: Cell) -> None:
    created = cell.admin.put("/admin/v1/tenants/bigco",
                             json={"plan": "enterprise", "daily_spend_limit": 500})
    auth = {"Authorization": f"Bearer {created.json()['api_key']}"}
    cell.admin.put("/admin/v1/tenants/bigco/targets", json={"name": "default", "url": "http://127.0.0.1:9/"})
    assert cell.submit(auth, "a", estimate=300).status_code == 202
    assert cell.submit(auth, "b", estimate=300).status_code == 402
    # A new day: the limit applies afresh, less what is still reserved.
    write(cell.conninfo, "UPDATE wallets SET spend_day = current_date - 1")
    assert cell.submit(auth, "c", estimate=200).status_code == 202
    assert fetch(cell.conninfo, "SELECT available, reserved FROM wallets") == [(0, 500)]


def test_export_then_import_carries_schedules_as_they_are_and_their_runs(cell: Cell, cell_postgres) -> None:  # type: ignore[no-untyped-def]
    auth = cell.tenant("acme")

    def create(schedule: dict[str, str], **body: object) -> str:
        created = cell.api.post("/v1/schedules", headers=auth, json={
            "schedule": schedule, "target": "default", "payload": {"n": 1}, **body})
        assert created.status_code == 201, created.text
        return str(created.json()["schedule_id"])

    create({"type": "ONCE", "run_at": "2031-06-01T09:00:00", "time_zone": "Europe/Berlin"})
    paused = create({"type": "CRON", "cron": "30 2 * * *", "time_zone": "America/New_York"})
    assert cell.api.post(f"/v1/schedules/{paused}:pause", headers=auth).status_code == 200
    # One occurrence dispatched, its job running at the export.
    ran = create({"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"}, dispatch_window_seconds=0)
    write(cell.conninfo, "UPDATE schedules SET next_at = date_trunc('year', now() AT TIME ZONE 'UTC')"
                         " AT TIME ZONE 'UTC', dispatch_at = date_trunc('year', now() AT TIME ZONE 'UTC')"
                         " AT TIME ZONE 'UTC' WHERE schedule_id = %s", ran)
    with cell.pool.connection() as conn:
        assert dispatch_due(conn, batch=10).jobs == 1
        assert len(jobqueue.claim(conn, worker="w", batch=1, lease_seconds=60)) == 1
    bundle = cell.admin.get("/admin/v1/tenants/acme/export").json()
    assert len(bundle["schedules"]) == 3 and len(bundle["schedule_runs"]) == 1
    rows = ("SELECT 'schedule', row_to_json(s)::jsonb FROM schedules s UNION ALL"
            " SELECT 'run', row_to_json(r)::jsonb FROM schedule_runs r ORDER BY 1, 2")

    target_db = create_cell_database(cell_postgres.postgres["cell"], f"target_{uuid.uuid4().hex[:8]}")
    target = Cell(target_db)
    try:
        for _ in range(2):    # importing twice changes nothing the second time
            answer = target.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 2, "bundle": bundle})
            assert answer.status_code == 200, answer.text
            assert answer.json()["imported"]["schedules"] == 3
        # Every column as exported: next times, dispatch times, states, the latest run's job.
        assert fetch(target_db, rows) == fetch(cell.conninfo, rows)
        # The run in flight is queued there under its one key, and its occurrence is
        # not dispatched again.
        assert fetch(target_db, "SELECT j.status, s.idempotency_key = r.idempotency_key FROM schedule_runs r"
                                " JOIN jobs j USING (job_id) JOIN job_steps s USING (job_id)") == [
            ("queued", True)]
        with target.pool.connection() as conn:
            assert dispatch_due(conn, batch=10).jobs == 0
    finally:
        target.close()


def test_the_strict_allowance_is_a_quota_with_the_plans_default_and_ceiling(cell: Cell) -> None:
    default = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro"})
    assert default.json()["tenant"]["strict_schedules"] == 5
    given = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "pro", "strict_schedules": 9})
    assert given.status_code == 200, given.text
    assert fetch(cell.conninfo, "SELECT strict_schedules FROM tenants") == [(9,)]
    # Strict dispatch is not on the free plan: its ceiling is 0.
    free = cell.admin.put("/admin/v1/tenants/acme", json={"plan": "free", "strict_schedules": 1})
    assert free.status_code == 422 and free.json()["error"]["code"] == "quota_out_of_range"
    assert cell.admin.put("/admin/v1/tenants/acme",
                          json={"plan": "pro", "strict_schedules": -1}).status_code == 422
    assert fetch(cell.conninfo, "SELECT strict_schedules FROM tenants") == [(9,)]


def test_a_bundle_from_a_cell_without_the_strict_allowance_gets_its_plans_default(  # type: ignore[no-untyped-def]
        cell: Cell, cell_postgres) -> None:
    cell.tenant("acme", strict_schedules=1)
    bundle = cell.admin.get("/admin/v1/tenants/acme/export").json()
    # A cell before migration 0014 has no such column.
    del bundle["tenant"]["strict_schedules"]

    target_db = create_cell_database(cell_postgres.postgres["cell"], f"target_{uuid.uuid4().hex[:8]}")
    target = Cell(target_db)
    try:
        answer = target.admin.post("/admin/v1/tenants/acme/import", json={"epoch": 2, "bundle": bundle})
        assert answer.status_code == 200, answer.text
        # Unknown (NULL): the plan's default, which the API counts against (pro: 5).
        assert fetch(target_db, "SELECT strict_schedules FROM tenants") == [(None,)]
        summary = target.admin.get("/admin/v1/tenants/acme").json()
        assert summary["strict_schedules"] == PLAN_DEFAULTS[Plan.PRO].strict_schedules == 5
    finally:
        target.close()


def test_the_migrations_default_is_the_plan_tables(cell: Cell) -> None:
    """Migration 0014 fills the allowance of existing tenants and of old bundles with the
    plan defaults; a change of the defaults needs a migration that replaces the function."""
    for plan in Plan:
        assert fetch(cell.conninfo, "SELECT cellplane_strict_schedules_default(%s)",
                     plan.value) == [(PLAN_DEFAULTS[plan].strict_schedules,)]
