"""Priority classes on a real cell database: the claim round honours the floors, a CRITICAL
job takes the first slot a LOW flood frees, and tenants still take turns within a class."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from cellapi import Cell
from cellfixtures import create_cell_database, enqueue, fetch, setup_tenant, write
from cellplane_cells import jobqueue
from cellplane_cells.db import open_pool
from cellplane_cells.dispatch import dispatch_due
from cellplane_cells.domain.plans import Plan
from cellplane_cells.domain.priorities import Floors, Priority
from cellplane_cells.tenants import TenantSpec, upsert_tenant
from cellplane_cells.worker import Worker, WorkerConfig, claim_round
from httpservers import Call, RecordingServer
from starlette.responses import JSONResponse, Response

CRITICAL, HIGH, DEFAULT, LOW = Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW
WORKER = WorkerConfig(worker_id="w", epoch=1, slots=10, batch=4,
                      floors=Floors(10, {CRITICAL: 2, HIGH: 2, DEFAULT: 2, LOW: 1}))


@pytest.fixture
def conn(cell_db: str) -> Iterator[psycopg.Connection[object]]:
    with psycopg.connect(cell_db, autocommit=True) as c:
        c.execute("SET cellplane.epoch = '1'")
        yield c


def tenants(conn: psycopg.Connection[object], *names: str, cap: int = 50) -> None:
    for name in names:
        # A strict allowance: only tenants with one may queue CRITICAL work.
        upsert_tenant(conn, TenantSpec(name, Plan.ENTERPRISE, max_running_jobs=cap,
                                       strict_schedules=1))
    conn.commit()


def by_class(jobs: list[jobqueue.ClaimedJob]) -> Counter[Priority]:
    return Counter(job.priority for job in jobs)


def test_a_critical_job_takes_the_first_slot_a_low_flood_frees(
        conn: psycopg.Connection[object]) -> None:
    names = [f"tenant-{i}" for i in range(5)]
    tenants(conn, *names)
    for name in names:
        enqueue(conn, name, 200, priority="LOW")
    flood = claim_round(conn, WORKER, Counter())
    assert by_class(flood) == {LOW: 10}  # idle slots, CRITICAL's floor included, borrowed

    # The newest job in the queue, behind 990 LOW jobs of every tenant, its own included.
    [critical] = enqueue(conn, "tenant-3", 1, priority="CRITICAL")
    assert claim_round(conn, WORKER, Counter({LOW: 10})) == []  # no slot free, none preempted
    assert jobqueue.complete(conn, flood[0], cost=0)
    [first] = claim_round(conn, WORKER, Counter({LOW: 9}))
    assert (first.job_id, first.priority) == (critical, CRITICAL)
    assert first.waited_seconds >= 0
    # With the CRITICAL queue empty, the next freed slot goes back to LOW.
    assert jobqueue.complete(conn, flood[1], cost=0)
    assert by_class(claim_round(conn, WORKER, Counter({LOW: 8, CRITICAL: 1}))) == {LOW: 1}


def test_without_classes_the_same_critical_job_waits_behind_its_tenants_low_jobs(
        conn: psycopg.Connection[object]) -> None:
    """The reference: one class for everything is today's oldest-job-first claim."""
    tenants(conn, "acme")
    enqueue(conn, "acme", 20, priority="LOW")
    [critical] = enqueue(conn, "acme", 1, priority="CRITICAL")
    conn.execute("UPDATE jobs SET priority = 'DEFAULT'")
    claimed = [job.job_id for _ in range(21)
               for job in jobqueue.claim(conn, worker="w", batch=1, lease_seconds=60)]
    assert claimed.index(critical) == 20


def test_a_class_keeps_its_floor_under_a_higher_flood_and_tenants_take_turns_in_a_class(
        conn: psycopg.Connection[object], cell_db: str) -> None:
    tenants(conn, "a", "b", "c")
    tenants(conn, "capped", cap=2)
    for name in ("a", "b", "c", "capped"):
        enqueue(conn, name, 50, priority="HIGH")
        enqueue(conn, name, 50, priority="LOW")
    jobs = claim_round(conn, WORKER, Counter())
    assert by_class(jobs) == {HIGH: 9, LOW: 1}
    high = Counter(job.tenant_id for job in jobs if job.priority is HIGH)
    # Round-robin within HIGH: the capped tenant's cap holds, the others share the rest.
    assert high["capped"] <= 2 and sum(high.values()) == 9
    assert max(high[t] for t in "abc") - min(high[t] for t in "abc") <= 1
    assert fetch(cell_db, "SELECT running FROM tenants WHERE tenant_id = 'capped'")[0][0] <= 2


def test_the_classes_with_claimable_work_leave_out_capped_and_paused_tenants(
        conn: psycopg.Connection[object]) -> None:
    tenants(conn, "full", cap=1)
    tenants(conn, "paused")
    enqueue(conn, "full", 2, priority="CRITICAL")
    enqueue(conn, "paused", 1, priority="HIGH")
    enqueue(conn, "full", 1, priority="LOW")
    conn.execute("UPDATE tenants SET state = 'paused' WHERE tenant_id = 'paused'")
    assert jobqueue.claimable_classes(conn) == {CRITICAL, LOW}
    assert by_class(claim_round(conn, WORKER, Counter())) == {CRITICAL: 1}
    assert jobqueue.claimable_classes(conn) == set()


@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


def test_a_job_carries_its_class_and_an_unknown_one_is_refused_naming_the_field(
        cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=1)  # CRITICAL needs a strict allowance
    plain = cell.submit(auth, "k1")
    urgent = cell.submit(auth, "k2", priority="CRITICAL")
    assert plain.status_code == urgent.status_code == 202
    read = cell.api.get(f"/v1/jobs/{urgent.json()['job_id']}", headers=auth).json()
    assert read["priority"] == "CRITICAL"
    listed = cell.api.get("/v1/jobs", headers=auth).json()["jobs"]
    assert sorted(job["priority"] for job in listed) == ["CRITICAL", "DEFAULT"]
    refused = cell.submit(auth, "k3", priority="URGENT")
    assert refused.status_code == 422
    assert [f["field"] for f in refused.json()["error"]["fields"]] == ["body.priority"]
    # The same key with another class is another request.
    assert cell.submit(auth, "k1", priority="LOW").status_code == 409


def test_a_schedule_queues_its_runs_in_its_class(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=1)  # one strict schedule, CRITICAL later
    body = {"schedule": {"type": "CRON", "cron": "* * * * *", "time_zone": "UTC"},
            "target": "default", "payload": {}, "dispatch_window_seconds": 0}
    created = cell.api.post("/v1/schedules", headers=auth, json={**body, "priority": "HIGH"})
    assert created.status_code == 201, created.text
    schedule_id = created.json()["schedule_id"]
    assert created.json()["priority"] == "HIGH"
    refused = cell.api.put(f"/v1/schedules/{schedule_id}", headers=auth,
                           json={**body, "priority": "urgent"})
    assert refused.status_code == 422
    assert [f["field"] for f in refused.json()["error"]["fields"]] == ["body.priority"]
    updated = cell.api.put(f"/v1/schedules/{schedule_id}", headers=auth,
                           json={**body, "priority": "CRITICAL"})
    assert updated.json()["priority"] == "CRITICAL"
    assert cell.api.get(f"/v1/schedules/{schedule_id}", headers=auth).json()["priority"] == \
        "CRITICAL"
    # Due now by the database's clock, as after a minute's wait.
    write(cell.conninfo, "UPDATE schedules SET next_at = date_trunc('minute', now()),"
                         " dispatch_at = date_trunc('minute', now())")
    with cell.pool.connection() as conn:
        assert dispatch_due(conn, batch=10).jobs == 1
    assert fetch(cell.conninfo, "SELECT priority FROM jobs WHERE job_id = (SELECT job_id FROM"
                                " schedule_runs WHERE schedule_id = %s)",
                 uuid.UUID(schedule_id)) == [("CRITICAL",)]


def test_an_imported_and_a_redriven_job_keep_their_class(cell: Cell, cell_postgres) -> None:  # type: ignore[no-untyped-def]
    auth = cell.tenant("acme", credit=1000, burst=20)
    job_id = cell.submit(auth, "a", estimate=100, priority="HIGH").json()["job_id"]
    bundle = cell.admin.get("/admin/v1/tenants/acme/export").json()
    target_db = create_cell_database(cell_postgres.postgres["cell"],
                                     f"target_{uuid.uuid4().hex[:8]}")
    target = Cell(target_db)
    try:
        imported = target.admin.post("/admin/v1/tenants/acme/import",
                                     json={"epoch": 2, "bundle": bundle})
        assert imported.status_code == 200, imported.text
        assert fetch(target_db, "SELECT priority FROM jobs") == [("HIGH",)]
    finally:
        target.close()
    write(cell.conninfo, "UPDATE jobs SET status = 'dead', finished_at = now()")
    with cell.pool.connection() as conn:
        jobqueue.refund(conn, uuid.UUID(job_id))
    redriven = cell.admin.post("/admin/v1/tenants/acme/dead-letter:redrive", json={"limit": 1})
    assert redriven.status_code == 200, redriven.text
    assert fetch(cell.conninfo, "SELECT priority FROM jobs WHERE redriven_from = %s",
                 uuid.UUID(job_id)) == [("HIGH",)]

async def test_a_worker_gives_a_freed_slot_to_a_waiting_critical_job_before_its_next_poll(
        cell_db: str) -> None:
    """One slot, a LOW job holding it at its target, a CRITICAL job queued behind it, and a
    poll interval far longer than the test's patience: the slot goes to the CRITICAL job
    when the LOW job ends, not when the worker next polls."""
    release = threading.Event()

    async def respond(call: Call) -> Response:
        while call.json["payload"].get("hold") and not release.is_set():
            await asyncio.sleep(0.02)
        return JSONResponse({"ok": True})

    with RecordingServer(respond) as target:
        setup_tenant(cell_db, "acme", target_url=f"{target.url}/run")
        with psycopg.connect(cell_db) as conn:
            conn.execute("SET cellplane.epoch = '1'")
            conn.execute("UPDATE jobs SET payload = '{\"hold\": true}'"
                         " WHERE job_id = ANY(%s)", (enqueue(conn, "acme", 1, priority="LOW"),))
            conn.commit()
        config = WorkerConfig("w", epoch=1, slots=1, floors=Floors.none(1), poll_seconds=600.0,
                              lease_seconds=30.0, heartbeat_seconds=5.0)
        stop = asyncio.Event()
        with open_pool(cell_db, epoch=1, max_size=4) as pool:
            async with httpx.AsyncClient() as http:
                running = asyncio.create_task(Worker(pool, http, config).run(stop))
                await until(lambda: len(target.snapshot()) == 1)  # the LOW job holds the slot
                with psycopg.connect(cell_db) as conn:
                    conn.execute("SET cellplane.epoch = '1'")
                    [critical] = enqueue(conn, "acme", 1, priority="CRITICAL")
                    enqueue(conn, "acme", 5, priority="LOW")
                release.set()
                # At least: the worker may run the queued LOW jobs between two looks.
                await until(lambda: len(target.snapshot()) >= 2)
                stop.set()
                await running
        assert target.snapshot()[1].json["job_id"] == str(critical)


async def until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    """Awaits ``condition``; far below the worker's 600 s poll, far above a busy machine's
    slowest claim."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
