"""The schedule dispatcher on a real cell database: never early, misfires, exactly one job
per occurrence with two dispatchers racing."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from cellapi import Cell
from cellfixtures import fetch, grant, setup_tenant, write
from cellplane_cells.db import open_pool
from cellplane_cells.dispatch import (
    Dispatched, Dispatcher, DispatcherConfig, dispatch_due, prune_runs,
)
from cellplane_cells.errors import StaleEpochError
from cellplane_cells.queries import query
from cellplane_cells.tenants import purge_tenant
from cellplane_cells.worker import Worker, WorkerConfig
from httpservers import Call, RecordingServer
from prometheus_client import REGISTRY
from starlette.responses import JSONResponse, Response

UTC = datetime.timezone.utc


@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


def db_now(cell: Cell) -> datetime.datetime:
    return fetch(cell.conninfo, "SELECT now()")[0][0]  # type: ignore[no-any-return]


def create(cell: Cell, auth: dict[str, str], schedule: dict[str, str], **body: Any) -> str:
    created = cell.api.post("/v1/schedules", headers=auth, json={
        "schedule": schedule, "target": "default", "payload": {"n": 1}, **body})
    assert created.status_code == 201, created.text
    return str(created.json()["schedule_id"])


def dispatch(cell: Cell, batch: int = 100) -> Dispatched:
    with cell.pool.connection() as conn:
        return dispatch_due(conn, batch=batch)


def runs(cell: Cell) -> list[tuple[Any, ...]]:
    return fetch(cell.conninfo, "SELECT r.schedule_id::text, r.scheduled_for, r.idempotency_key,"
                                " s.idempotency_key, j.status, j.run_after, j.created_at"
                                " FROM schedule_runs r JOIN jobs j USING (job_id)"
                                " JOIN job_steps s USING (job_id) ORDER BY 1, 2")


def lag_metric() -> tuple[float, float]:
    """(observations, their sum) of the dispatch-lag histogram so far."""
    name = "cellplane_cell_schedule_dispatch_lag_seconds"
    return (REGISTRY.get_sample_value(f"{name}_count") or 0.0,
            REGISTRY.get_sample_value(f"{name}_sum") or 0.0)


def outage(cell: Cell, schedule_id: str, next_at: datetime.datetime) -> None:
    """As if the cell had been down since ``next_at`` was due."""
    write(cell.conninfo, "UPDATE schedules SET next_at = %s, dispatch_at = %s + dispatch_offset"
                         " WHERE schedule_id = %s", next_at, next_at, schedule_id)


def test_a_once_schedule_becomes_one_job_at_its_time_and_not_before(cell: Cell) -> None:
    auth = cell.tenant("acme")
    run_at = (db_now(cell) + datetime.timedelta(seconds=3)).replace(microsecond=0, tzinfo=None)
    schedule_id = create(cell, auth, {"type": "ONCE", "run_at": run_at.isoformat(),
                                      "time_zone": "UTC"}, dispatch_window_seconds=0)
    assert dispatch(cell) == Dispatched(schedules=0, jobs=0)
    assert runs(cell) == []
    count, total = lag_metric()
    deadline = time.monotonic() + 10
    while dispatch(cell).jobs == 0:
        assert time.monotonic() < deadline, "the occurrence was never dispatched"
        time.sleep(0.2)
    # One lag observed, not negative (not early) and within a polling interval or so.
    assert lag_metric()[0] == count + 1 and 0 <= lag_metric()[1] - total < 5
    scheduled = run_at.replace(tzinfo=UTC)
    [(sid, scheduled_for, key, step_key, status, run_after, created_at)] = runs(cell)
    assert (sid, scheduled_for, status) == (schedule_id, scheduled, "queued")
    assert key == step_key == f"{schedule_id}:{run_at:%Y-%m-%dT%H:%M:%S}Z"
    # Never early, by the database's clock: queued and claimable only from its time on.
    assert run_after >= scheduled and created_at >= scheduled
    state = cell.api.get(f"/v1/schedules/{schedule_id}", headers=auth).json()
    assert (state["state"], state["next_run_at"]) == ("completed", None)
    history = cell.api.get(f"/v1/schedules/{schedule_id}/runs", headers=auth).json()["runs"]
    assert [(r["idempotency_key"], r["status"]) for r in history] == [(key, "queued")]
    assert dispatch(cell).jobs == 0


@pytest.mark.parametrize(("policy", "years_run"), [
    ("RUN_ONCE", [0]), ("SKIP", []), ("RUN_ALL", [-1, 0])])
def test_after_an_outage_the_misfire_policy_decides_and_the_next_is_next_year(
        cell: Cell, policy: str, years_run: list[int]) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"},
                         misfire_policy=policy, max_catch_up_runs=2, dispatch_window_seconds=0)
    year = db_now(cell).year
    outage(cell, schedule_id, datetime.datetime(year - 3, 1, 1, tzinfo=UTC))
    count, _ = lag_metric()
    dispatch(cell)
    assert lag_metric()[0] == count + len(years_run)
    assert [r[1] for r in runs(cell)] == [datetime.datetime(year + n, 1, 1, tzinfo=UTC)
                                          for n in years_run]
    assert fetch(cell.conninfo, "SELECT next_at FROM schedules") == [
        (datetime.datetime(year + 1, 1, 1, tzinfo=UTC),)]


def test_a_paused_schedule_waits_and_on_resume_its_missed_runs_follow_the_policy(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 * *", "time_zone": "UTC"},
                         dispatch_window_seconds=0)
    path = f"/v1/schedules/{schedule_id}"
    assert cell.api.post(f"{path}:pause", headers=auth).status_code == 200
    now = db_now(cell)
    month_start = datetime.datetime(now.year, now.month, 1, tzinfo=UTC)
    outage(cell, schedule_id, datetime.datetime(now.year - 1, now.month, 1, tzinfo=UTC))
    assert dispatch(cell).jobs == 0
    assert cell.api.post(f"{path}:resume", headers=auth).status_code == 200
    assert dispatch(cell) == Dispatched(schedules=1, jobs=1)
    assert [r[1] for r in runs(cell)] == [month_start]  # RUN_ONCE: the latest missed
    # The run's job is queued: the schedule is busy and refuses an update.
    busy = cell.api.put(path, headers=auth, json={
        "schedule": {"type": "CRON", "cron": "0 0 2 * *", "time_zone": "UTC"},
        "target": "default", "payload": {}})
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "schedule_running"


def test_a_paused_tenants_schedules_wait(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"})
    outage(cell, schedule_id, datetime.datetime(2020, 1, 1, tzinfo=UTC))
    write(cell.conninfo, "UPDATE tenants SET state = 'paused'")
    assert dispatch(cell).jobs == 0
    write(cell.conninfo, "UPDATE tenants SET state = 'active'")
    assert dispatch(cell).jobs == 1


def test_two_dispatchers_racing_make_exactly_one_job_per_occurrence(cell: Cell) -> None:
    auth = cell.tenant("acme")
    other = cell.tenant("other")
    ids = [create(cell, who, {"type": "CRON", "cron": "0 0 1 * *", "time_zone": "Europe/Berlin"},
                  misfire_policy="RUN_ALL", max_catch_up_runs=3)
           for who in (auth, other) for _ in range(20)]
    now = db_now(cell)
    for schedule_id in ids:
        outage(cell, schedule_id, now - datetime.timedelta(days=200))
    barrier = threading.Barrier(2)
    made: list[int] = []
    errors: list[BaseException] = []

    def dispatcher() -> None:
        try:
            with psycopg.connect(cell.conninfo, autocommit=True) as conn:
                conn.execute("SET cellplane.epoch = '1'")
                barrier.wait()
                while (done := dispatch_due(conn, batch=3)).schedules:
                    made.append(done.jobs)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=dispatcher) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    found = runs(cell)
    assert sum(made) == len(found) == 40 * 3
    assert len({(r[0], r[1]) for r in found}) == len(found)  # no occurrence twice
    assert len({r[2] for r in found}) == len(found)  # a different key per run
    assert fetch(cell.conninfo, "SELECT count(*) FROM jobs") == [(120,)]
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules WHERE next_at <= now()") == [(0,)]


def test_the_same_occurrence_dispatched_again_makes_no_second_job(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"})
    last_year = datetime.datetime(db_now(cell).year, 1, 1, tzinfo=UTC)
    outage(cell, schedule_id, last_year)
    assert dispatch(cell).jobs == 1
    # As if a dispatcher had planned from a read older than the advance.
    outage(cell, schedule_id, last_year)
    assert dispatch(cell) == Dispatched(schedules=1, jobs=0)
    assert len(runs(cell)) == 1


def test_run_history_past_its_retention_is_pruned(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"})
    outage(cell, schedule_id, datetime.datetime(2020, 1, 1, tzinfo=UTC))
    dispatch(cell)
    write(cell.conninfo, "UPDATE schedule_runs SET dispatched_at = now() - interval '31 days'")
    with cell.pool.connection() as conn:
        assert prune_runs(conn, days=30) == 1
    assert runs(cell) == [] and fetch(cell.conninfo, "SELECT count(*) FROM jobs") == [(1,)]
    assert uuid.UUID(schedule_id)


async def test_the_target_sees_the_runs_key_on_every_try_and_the_next_run_gets_another(
        cell_db: str) -> None:
    answers = iter([503, 200, 200])

    async def flaky(call: Call) -> Response:
        return JSONResponse({"ok": True}, status_code=next(answers))

    with RecordingServer(flaky) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        schedule_id = uuid.uuid4()
        write(cell_db, "INSERT INTO schedules (schedule_id, tenant_id, kind, cron, time_zone, target,"
                       " payload, max_attempts, misfire_policy, max_catch_up_runs,"
                       " dispatch_window_seconds, dispatch_offset, state, next_at, dispatch_at)"
                       " VALUES (%s, 'acme', 'CRON', '0 0 1 1 *', 'UTC', 'default', '{}', 3,"
                       " 'RUN_ALL', 2, 0, '0', 'active', '2020-01-01Z', '2020-01-01Z')",
                       schedule_id)
        with open_pool(cell_db, epoch=1, max_size=4) as pool:
            with pool.connection() as conn:
                assert dispatch_due(conn, batch=10).jobs == 2  # RUN_ALL, at most 2
            async with httpx.AsyncClient() as http:
                config = WorkerConfig("w1", epoch=1, lease_seconds=2.0, heartbeat_seconds=0.3,
                                      poll_seconds=0.05)
                worker = Worker(pool, http, config)
                for _ in range(3):
                    # Each round also skips the failed try's backoff.
                    write(cell_db, "UPDATE jobs SET run_after = now() WHERE status = 'queued'")
                    await worker.run_until_idle()
        assert fetch(cell_db, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == [(2,)]
        keys = [c.headers["idempotency-key"] for c in target.snapshot()]
    year = int(fetch(cell_db, "SELECT extract(year FROM now())::int")[0][0])
    last, latest = f"{schedule_id}:{year - 1}-01-01T00:00:00Z", f"{schedule_id}:{year}-01-01T00:00:00Z"
    # The run that failed once was tried again under the same key; each run has its own.
    assert sorted(keys) == sorted([last, latest, keys[0]])
    assert keys.count(keys[0]) == 2


def test_a_purge_during_a_dispatch_pass_waits_for_it_instead_of_deadlocking(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"})
    outage(cell, schedule_id, datetime.datetime(2020, 1, 1, tzinfo=UTC))
    purged: list[object] = []

    def purge() -> None:
        with psycopg.connect(cell.conninfo, autocommit=True) as conn:
            conn.execute("SET cellplane.epoch = '1'")
            try:
                purged.append(purge_tenant(conn, "acme"))
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                purged.append(error)

    with psycopg.connect(cell.conninfo, autocommit=True) as dispatcher:
        dispatcher.execute("SET cellplane.epoch = '1'")
        with dispatcher.transaction():
            # The pass has locked the schedule; the purge starts meanwhile.
            assert dispatcher.execute(query("lock_due_schedules"), {"batch": 10}).fetchall()
            thread = threading.Thread(target=purge)
            thread.start()
            time.sleep(0.5)
            # The pass's job references the tenant, as its insert does.
            dispatcher.execute("INSERT INTO jobs (job_id, tenant_id, status, target, step_count,"
                               " payload, max_attempts, estimate) VALUES (gen_random_uuid(),"
                               " 'acme', 'queued', 'default', 1, '{}', 1, 0)")
        thread.join(timeout=30)
    assert len(purged) == 1 and isinstance(purged[0], dict), purged
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(0,)]


def test_a_dispatcher_under_a_stale_epoch_dispatches_nothing(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"})
    outage(cell, schedule_id, datetime.datetime(2020, 1, 1, tzinfo=UTC))
    grant(cell.conninfo, epoch=2, seconds=3600)  # a new owner took the placement group
    with open_pool(cell.conninfo, epoch=1, max_size=2) as stale, stale.connection() as conn:
        with pytest.raises(StaleEpochError):
            dispatch_due(conn, batch=10)
    assert runs(cell) == [] and fetch(cell.conninfo, "SELECT count(*) FROM jobs") == [(0,)]
    with open_pool(cell.conninfo, epoch=2, max_size=2) as owner, owner.connection() as conn:
        assert dispatch_due(conn, batch=10).jobs == 1


async def test_the_dispatcher_loop_dispatches_due_schedules_until_stopped(cell: Cell) -> None:
    auth = cell.tenant("acme")
    ids = [create(cell, auth, {"type": "CRON", "cron": "0 0 1 1 *", "time_zone": "UTC"})
           for _ in range(5)]
    for schedule_id in ids:
        outage(cell, schedule_id, datetime.datetime(2020, 1, 1, tzinfo=UTC))
    stop = asyncio.Event()
    # A batch of 2: the loop goes on at once while batches come back full.
    dispatcher = Dispatcher(cell.pool, DispatcherConfig(batch=2, poll_seconds=0.05), name="t")
    loop = asyncio.create_task(dispatcher.run(stop))
    deadline = time.monotonic() + 10
    while len(runs(cell)) < 5:
        assert time.monotonic() < deadline, "the loop did not dispatch every due schedule"
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(loop, timeout=5)
    assert dispatcher.fenced is None
    assert len({r[0] for r in runs(cell)}) == 5
