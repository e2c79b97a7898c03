"""The tenant API's schedules on a real cell database (FastAPI's in-process client)."""

from __future__ import annotations

import datetime
import threading
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cellapi import Cell
from cellfixtures import enqueue, fetch, write
from cellplane_cells.domain.schedules import (
    MisfireRule, ScheduleId, cron, dispatch_offset, first_after,
)
from cellplane_cells.errors import StrictAllowanceExceededError
from cellplane_cells.schedules import ScheduleSpec, create_schedule

import psycopg

NEW_YORK = {"type": "CRON", "cron": "0 8 * * *", "time_zone": "America/New_York"}


@pytest.fixture
def cell(cell_db: str) -> Iterator[Cell]:
    c = Cell(cell_db)
    yield c
    c.close()


def create(cell: Cell, auth: dict[str, str], **body: Any) -> Any:
    return cell.api.post("/v1/schedules", headers=auth,
                         json={"schedule": NEW_YORK, "target": "default", "payload": {"x": 1}, **body})


def db_now(cell: Cell) -> datetime.datetime:
    return fetch(cell.conninfo, "SELECT now()")[0][0]  # type: ignore[no-any-return]


def test_a_cron_schedule_is_created_with_its_first_occurrence_after_the_database_clock(
        cell: Cell) -> None:
    auth = cell.tenant("acme")
    before = db_now(cell)
    created = create(cell, auth)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["state"] == "active"
    assert body["schedule"] == {**NEW_YORK, "run_at": None}
    assert (body["misfire_policy"], body["dispatch_window_seconds"], body["max_catch_up_runs"]) == (
        "RUN_ONCE", 300, 10)
    next_at = datetime.datetime.fromisoformat(body["next_run_at"])
    assert next_at == first_after(cron("0 8 * * *", "America/New_York"), before)
    local = datetime.datetime.fromisoformat(body["next_run_local"])
    assert (local.hour, local.minute) == (8, 0) and local == next_at
    # The dispatcher's columns: the offset is the hash of the id, due at next_at plus it.
    schedule_id = ScheduleId(uuid.UUID(body["schedule_id"]))
    assert fetch(cell.conninfo, "SELECT dispatch_offset, dispatch_at FROM schedules") == [
        (dispatch_offset(schedule_id, 300), next_at + dispatch_offset(schedule_id, 300))]
    assert cell.api.get(f"/v1/schedules/{schedule_id}", headers=auth).json() == body


def test_a_once_schedule_keeps_its_local_time_and_runs_by_the_dst_rule(cell: Cell) -> None:
    auth = cell.tenant("acme")
    created = create(cell, auth, schedule={"type": "ONCE", "run_at": "2030-03-10T02:30:00",
                                           "time_zone": "America/New_York"},
                     dispatch_window_seconds=0)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["schedule"]["run_at"] == "2030-03-10T02:30:00"
    # 02:30 does not exist that night: the first instant after the gap, 03:00 EDT.
    assert body["next_run_at"] == "2030-03-10T07:00:00Z"
    assert body["next_run_local"] == "2030-03-10T03:00:00-04:00"


@pytest.mark.parametrize(("schedule", "field"), [
    ({"type": "CRON", "cron": "0 8 * * *", "time_zone": "Mars/Olympus_Mons"}, "body.schedule.time_zone"),
    ({"type": "CRON", "cron": "0 0 30 2 *", "time_zone": "UTC"}, "body.schedule.cron"),
    ({"type": "CRON", "cron": "0 0 * * * *", "time_zone": "UTC"}, "body.schedule.cron"),
    ({"type": "CRON", "cron": "0 0 L * *", "time_zone": "UTC"}, "body.schedule.cron"),
    ({"type": "ONCE", "run_at": "2030-01-01T09:00:00+01:00", "time_zone": "Europe/Berlin"},
     "body.schedule.run_at"),
    ({"type": "ONCE", "run_at": "next tuesday", "time_zone": "Europe/Berlin"}, "body.schedule.run_at"),
])
def test_a_refused_schedule_is_a_422_naming_the_field(cell: Cell, schedule: dict[str, str],
                                                      field: str) -> None:
    auth = cell.tenant("acme")
    refused = create(cell, auth, schedule=schedule)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "invalid_request"
    assert [f["field"] for f in refused.json()["error"]["fields"]] == [field]
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(0,)]


@pytest.mark.parametrize("body", [
    {"schedule": {"type": "WEEKLY", "time_zone": "UTC"}, "target": "default", "payload": {}},
    {"schedule": {"type": "CRON", "cron": 5, "time_zone": "UTC"}, "target": "default", "payload": {}},
    {"schedule": NEW_YORK, "target": "default", "payload": {}, "dispatch_window_seconds": -1},
    {"schedule": NEW_YORK, "target": "default", "payload": {}, "misfire_policy": "LATER"},
    {"schedule": NEW_YORK, "target": "default", "payload": {}, "max_catch_up_runs": 0},
    {"schedule": NEW_YORK, "target": "default", "payload": {}, "surprise": 1},
    {"schedule": None, "target": "default", "payload": {}},
    [],
])
def test_schema_refusals_are_json_422s_never_500s(cell: Cell, body: Any) -> None:
    auth = cell.tenant("acme")
    refused = cell.api.post("/v1/schedules", headers=auth, json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["fields"]


def test_an_unregistered_target_is_refused(cell: Cell) -> None:
    auth = cell.tenant("acme")
    refused = create(cell, auth, target="nowhere")
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "target_not_registered"


def test_listing_pages_by_keyset_through_every_schedule_once(cell: Cell) -> None:
    auth = cell.tenant("acme")
    other = cell.tenant("other")
    made = {create(cell, auth).json()["schedule_id"] for _ in range(5)}
    create(cell, other)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = cell.api.get("/v1/schedules", headers=auth, params=params).json()
        seen += [s["schedule_id"] for s in page["schedules"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and len(seen) == 5 and set(seen) == made
    assert cell.api.get("/v1/schedules", headers=auth, params={"cursor": "junk"}).status_code == 422
    paused = seen[0]
    assert cell.api.post(f"/v1/schedules/{paused}:pause", headers=auth).status_code == 200
    only = cell.api.get("/v1/schedules", headers=auth, params={"state": "paused"}).json()
    assert [s["schedule_id"] for s in only["schedules"]] == [paused]


def test_pause_resume_and_cancel_follow_the_states(cell: Cell) -> None:
    auth = cell.tenant("acme")
    created = create(cell, auth).json()
    path = f"/v1/schedules/{created['schedule_id']}"
    paused = cell.api.post(f"{path}:pause", headers=auth)
    assert paused.json()["state"] == "paused"
    assert paused.json()["next_run_at"] == created["next_run_at"]  # kept for the misfire policy
    assert cell.api.post(f"{path}:pause", headers=auth).status_code == 200  # a retry is harmless
    assert cell.api.post(f"{path}:resume", headers=auth).json()["state"] == "active"
    cancelled = cell.api.post(f"{path}:cancel", headers=auth)
    assert (cancelled.json()["state"], cancelled.json()["next_run_at"]) == ("cancelled", None)
    refused = cell.api.post(f"{path}:resume", headers=auth)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "schedule_state_conflict"
    assert cell.api.put(path, headers=auth, json={"schedule": NEW_YORK, "target": "default",
                                                  "payload": {}}).status_code == 409


def test_another_tenants_schedule_is_not_found(cell: Cell) -> None:
    auth = cell.tenant("acme")
    other = cell.tenant("other")
    path = f"/v1/schedules/{create(cell, auth).json()['schedule_id']}"
    for answer in (cell.api.get(path, headers=other), cell.api.post(f"{path}:cancel", headers=other),
                   cell.api.get(f"{path}/runs", headers=other),
                   cell.api.get("/v1/schedules/not-a-uuid", headers=auth)):
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "not_found"


def test_an_update_is_refused_while_the_current_occurrence_runs(cell: Cell) -> None:
    auth = cell.tenant("acme")
    created = create(cell, auth).json()
    path = f"/v1/schedules/{created['schedule_id']}"
    with psycopg.connect(cell.conninfo) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        [job_id] = enqueue(conn, "acme", 1)
    write(cell.conninfo, "UPDATE schedules SET last_job_id = %s", job_id)
    berlin = {"type": "CRON", "cron": "30 6 * * 1-5", "time_zone": "Europe/Berlin"}
    body = {"schedule": berlin, "target": "default", "payload": {"v": 2},
            "dispatch_window_seconds": 0}
    busy = cell.api.put(path, headers=auth, json=body)
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "schedule_running"
    write(cell.conninfo, "UPDATE jobs SET status = 'succeeded'")
    updated = cell.api.put(path, headers=auth, json=body)
    assert updated.status_code == 200, updated.text
    after = updated.json()
    assert after["schedule_id"] == created["schedule_id"] and after["payload"] == {"v": 2}
    local = datetime.datetime.fromisoformat(after["next_run_local"])
    assert (local.hour, local.minute, local.weekday() < 5) == (6, 30, True)
    assert local.utcoffset() in (datetime.timedelta(hours=1), datetime.timedelta(hours=2))
    assert fetch(cell.conninfo, "SELECT dispatch_at = next_at FROM schedules") == [(True,)]


def test_the_run_history_shows_each_runs_key_job_and_outcome(cell: Cell) -> None:
    auth = cell.tenant("acme")
    schedule_id = create(cell, auth).json()["schedule_id"]
    with psycopg.connect(cell.conninfo) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        jobs = enqueue(conn, "acme", 3)
    for n, job_id in enumerate(jobs):
        at = datetime.datetime(2026, 5, 1 + n, 12, tzinfo=datetime.timezone.utc)
        write(cell.conninfo, "INSERT INTO schedule_runs (schedule_id, scheduled_for, tenant_id, job_id,"
              " idempotency_key) VALUES (%s, %s, 'acme', %s, %s)",
              schedule_id, at, job_id, f"{schedule_id}:{at:%Y-%m-%dT%H:%M:%SZ}")
    write(cell.conninfo, "UPDATE jobs SET status = 'succeeded', attempts = 2 WHERE job_id = %s", jobs[2])
    first = cell.api.get(f"/v1/schedules/{schedule_id}/runs", headers=auth, params={"limit": 2}).json()
    assert [r["idempotency_key"] for r in first["runs"]] == [
        f"{schedule_id}:2026-05-03T12:00:00Z", f"{schedule_id}:2026-05-02T12:00:00Z"]
    assert (first["runs"][0]["status"], first["runs"][0]["attempts"]) == ("succeeded", 2)
    rest = cell.api.get(f"/v1/schedules/{schedule_id}/runs", headers=auth,
                        params={"cursor": first["next_cursor"]}).json()
    assert [r["job_id"] for r in rest["runs"]] == [str(jobs[0])] and rest["next_cursor"] is None


def test_a_schedule_write_under_a_stale_epoch_is_refused(cell: Cell) -> None:
    auth = cell.tenant("acme")
    create(cell, auth)
    with pytest.raises(psycopg.Error, match="stale epoch"):
        write(cell.conninfo, "UPDATE schedules SET state = 'paused'", epoch=7)
    assert fetch(cell.conninfo, "SELECT state FROM schedules") == [("active",)]


def test_a_zone_whose_rules_changed_reads_by_the_current_rules(cell: Cell) -> None:
    auth = cell.tenant("acme")
    body = create(cell, auth, schedule={"type": "ONCE", "run_at": "2030-04-07T02:30:00",
                                        "time_zone": "America/Mexico_City"}).json()
    # Mexico City has no DST since 2022: 02:30 on the first Sunday of April is ordinary.
    assert body["next_run_local"] == "2030-04-07T02:30:00-06:00"
    assert zoneinfo.ZoneInfo("America/Mexico_City")  # the zone exists on this site


def test_a_create_retried_with_its_idempotency_key_returns_the_first_schedule(cell: Cell) -> None:
    auth = cell.tenant("acme")
    keyed = {**auth, "Idempotency-Key": "digest-schedule-1"}
    first = create(cell, keyed)
    again = create(cell, keyed)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    changed = create(cell, keyed, payload={"x": 2})
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    # Without a key, or under another tenant, the same key is a new schedule.
    assert create(cell, auth).json()["schedule_id"] != first.json()["schedule_id"]
    other = cell.tenant("other")
    assert create(cell, {**other, "Idempotency-Key": "digest-schedule-1"}).status_code == 201
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(3,)]


def test_concurrent_creates_with_one_key_make_one_schedule(cell: Cell) -> None:
    auth = {**cell.tenant("acme"), "Idempotency-Key": "same"}
    answers: list[Any] = []
    barrier = threading.Barrier(6)

    def send() -> None:
        barrier.wait()
        answers.append(create(cell, auth))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["schedule_id"] for a in answers}) == 1
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(1,)]


# -- the strict allowance (domain/strict_allowance.py) ------------------------------------

STRICT = {"dispatch_window_seconds": 0}


def refused_over_allowance(answer: Any, *, allowance: int, in_use: int) -> None:
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["allowance"], error["in_use"]) == (
        "strict_allowance_exceeded", allowance, in_use)


def test_strict_schedules_are_refused_over_the_allowance_and_cancelling_frees_a_slot(
        cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=2)
    first, second = (create(cell, auth, **STRICT) for _ in range(2))
    assert first.status_code == second.status_code == 201
    refused_over_allowance(create(cell, auth, **STRICT), allowance=2, in_use=2)
    # A windowed schedule holds no slot; another tenant's strict ones are its own.
    assert create(cell, auth, dispatch_window_seconds=60).status_code == 201
    assert create(cell, cell.tenant("other", strict_schedules=1), **STRICT).status_code == 201
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules WHERE tenant_id = 'acme'"
                                " AND dispatch_window_seconds = 0") == [(2,)]
    cancelled = cell.api.post(f"/v1/schedules/{first.json()['schedule_id']}:cancel", headers=auth)
    assert cancelled.status_code == 200
    assert create(cell, auth, **STRICT).status_code == 201
    refused_over_allowance(create(cell, auth, **STRICT), allowance=2, in_use=2)


def test_a_paused_strict_schedule_frees_its_slot_until_it_is_resumed(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=1)
    paused = create(cell, auth, **STRICT).json()["schedule_id"]
    assert cell.api.post(f"/v1/schedules/{paused}:pause", headers=auth).status_code == 200
    taken = create(cell, auth, **STRICT)
    assert taken.status_code == 201
    refused_over_allowance(cell.api.post(f"/v1/schedules/{paused}:resume", headers=auth),
                           allowance=1, in_use=1)
    assert fetch(cell.conninfo, "SELECT state FROM schedules WHERE schedule_id = %s",
                 uuid.UUID(paused)) == [("paused",)]
    # Resuming an active one answers it unchanged, even at the allowance.
    resumed = cell.api.post(f"/v1/schedules/{taken.json()['schedule_id']}:resume", headers=auth)
    assert resumed.status_code == 200
    assert cell.api.post(f"/v1/schedules/{taken.json()['schedule_id']}:cancel",
                         headers=auth).status_code == 200
    assert cell.api.post(f"/v1/schedules/{paused}:resume", headers=auth).json()["state"] == "active"


def test_an_update_that_makes_a_schedule_strict_needs_a_free_slot(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=1)
    strict = create(cell, auth, **STRICT).json()["schedule_id"]
    windowed = create(cell, auth).json()["schedule_id"]
    body = {"schedule": NEW_YORK, "target": "default", "payload": {"v": 2}}
    refused_over_allowance(cell.api.put(f"/v1/schedules/{windowed}", headers=auth,
                                        json={**body, **STRICT}), allowance=1, in_use=1)
    assert fetch(cell.conninfo, "SELECT dispatch_window_seconds FROM schedules"
                                " WHERE schedule_id = %s", uuid.UUID(windowed)) == [(300,)]
    # The strict one stays strict through an edit: it adds no slot.
    kept = cell.api.put(f"/v1/schedules/{strict}", headers=auth, json={**body, **STRICT})
    assert kept.status_code == 200, kept.text
    # A paused schedule may become strict; it is counted when resumed.
    assert cell.api.post(f"/v1/schedules/{windowed}:pause", headers=auth).status_code == 200
    assert cell.api.put(f"/v1/schedules/{windowed}", headers=auth,
                        json={**body, **STRICT}).status_code == 200
    refused_over_allowance(cell.api.post(f"/v1/schedules/{windowed}:resume", headers=auth),
                           allowance=1, in_use=1)


def test_a_lowered_allowance_keeps_the_schedules_the_tenant_has(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=3)
    made = [create(cell, auth, **STRICT).json()["schedule_id"] for _ in range(3)]
    cell.tenant("acme", credit=0, strict_schedules=1)
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules WHERE state = 'active'") == [(3,)]
    edited = cell.api.put(f"/v1/schedules/{made[0]}", headers=auth,
                          json={"schedule": NEW_YORK, "target": "default", "payload": {}, **STRICT})
    assert edited.status_code == 200, edited.text
    refused_over_allowance(create(cell, auth, **STRICT), allowance=1, in_use=3)


def test_critical_must_be_strict_a_422_naming_the_priority(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=2)
    for window in ({}, {"dispatch_window_seconds": 1}):
        refused = create(cell, auth, priority="CRITICAL", **window)
        assert refused.status_code == 422, refused.text
        [field] = refused.json()["error"]["fields"]
        assert field["field"] == "body.priority"
        assert "CRITICAL must be strict" in field["problem"]
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(0,)]
    strict = create(cell, auth, priority="CRITICAL", **STRICT)
    assert strict.status_code == 201, strict.text
    refused = cell.api.put(f"/v1/schedules/{strict.json()['schedule_id']}", headers=auth,
                           json={"schedule": NEW_YORK, "target": "default", "payload": {},
                                 "priority": "CRITICAL", "dispatch_window_seconds": 300})
    assert refused.status_code == 422
    assert [f["field"] for f in refused.json()["error"]["fields"]] == ["body.priority"]


def test_without_an_allowance_there_is_no_strict_and_no_critical_work(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=0)
    refused_over_allowance(create(cell, auth, **STRICT), allowance=0, in_use=0)
    critical = create(cell, auth, priority="CRITICAL", **STRICT)
    refused_over_allowance(critical, allowance=0, in_use=0)
    assert "CRITICAL" in critical.json()["error"]["message"]
    refused_over_allowance(cell.submit(auth, "urgent", priority="CRITICAL"), allowance=0, in_use=0)
    assert cell.submit(auth, "high", priority="HIGH").status_code == 202
    assert create(cell, auth, priority="HIGH").status_code == 201  # windowed: no slot needed
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(1,)]
    assert fetch(cell.conninfo, "SELECT priority FROM jobs") == [("HIGH",)]
    # With an allowance the same job is taken (it holds no slot of it).
    allowed = cell.tenant("other", strict_schedules=1)
    assert cell.submit(allowed, "urgent", priority="CRITICAL").status_code == 202


def test_a_retried_strict_create_answers_its_schedule_even_at_the_allowance(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=1)
    keyed = {**auth, "Idempotency-Key": "strict-1"}
    first = create(cell, keyed, **STRICT)
    again = create(cell, keyed, **STRICT)
    assert first.status_code == again.status_code == 201
    assert again.json()["schedule_id"] == first.json()["schedule_id"]
    assert again.headers["idempotent-replayed"] == "true"
    refused_over_allowance(create(cell, {**auth, "Idempotency-Key": "strict-2"}, **STRICT),
                           allowance=1, in_use=1)


def race(count: int, send: Callable[[int], Any]) -> list[Any]:
    """``send(i)`` for i in range(count), all released at once; their answers."""
    answers: list[Any] = []
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        answers.append(send(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_concurrent_strict_creates_never_pass_the_allowance(cell: Cell) -> None:
    """Eight creates at once for three slots: exactly three are taken. Each counts under
    the tenant's strict lock, so none counts before another's schedule is committed."""
    auth = cell.tenant("acme", strict_schedules=3)
    answers = race(8, lambda _: create(cell, auth, **STRICT))
    assert sorted(a.status_code for a in answers) == [201] * 3 + [409] * 5
    for answer in answers:
        if answer.status_code == 409:
            refused_over_allowance(answer, allowance=3, in_use=3)
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules WHERE state = 'active'") == [(3,)]


def test_concurrent_resumes_never_pass_the_allowance(cell: Cell) -> None:
    auth = cell.tenant("acme", strict_schedules=2)
    paused = []
    for _ in range(6):  # each made while the others are paused, so within the allowance
        made = create(cell, auth, **STRICT).json()["schedule_id"]
        assert cell.api.post(f"/v1/schedules/{made}:pause", headers=auth).status_code == 200
        paused.append(made)
    answers = race(6, lambda i: cell.api.post(f"/v1/schedules/{paused[i]}:resume", headers=auth))
    assert sorted(a.status_code for a in answers) == [200] * 2 + [409] * 4
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules WHERE state = 'active'") == [(2,)]


def test_a_strict_create_waits_for_the_one_that_took_the_last_slot(cell: Cell) -> None:
    """Deterministic: while one create holds the tenant's last slot uncommitted, a second
    waits on the strict lock (seen in pg_stat_activity), and once the first commits it
    counts that schedule and is refused. Without the lock it would count 0 and pass."""
    cell.tenant("acme", strict_schedules=1)
    spec = ScheduleSpec(timing=cron("0 8 * * *", "UTC"), target="default", payload={},
                        max_attempts=1, misfire=MisfireRule(), dispatch_window_seconds=0)
    outcome: list[BaseException | None] = []
    with psycopg.connect(cell.conninfo) as first, psycopg.connect(cell.conninfo) as second:
        for conn in (first, second):
            conn.execute("SET cellplane.epoch = '1'")
            conn.commit()
        second_pid = second.info.backend_pid

        def create_second() -> None:
            try:
                create_schedule(second, "acme", spec)
                outcome.append(None)
            except StrictAllowanceExceededError as error:
                outcome.append(error)

        with first.transaction():  # the create's own transaction nests: nothing commits yet
            create_schedule(first, "acme", spec)
            waiting = threading.Thread(target=create_second)
            waiting.start()
            deadline = datetime.datetime.now() + datetime.timedelta(seconds=10)
            while fetch(cell.conninfo, "SELECT wait_event_type, wait_event FROM pg_stat_activity"
                                       " WHERE pid = %s", second_pid) != [("Lock", "advisory")]:
                assert datetime.datetime.now() < deadline, "the second create never waited"
                assert not outcome, "the second create finished without waiting"
        waiting.join()
    [error] = outcome
    assert isinstance(error, StrictAllowanceExceededError)
    assert (error.allowance, error.in_use) == (1, 1)
    assert fetch(cell.conninfo, "SELECT count(*) FROM schedules") == [(1,)]
