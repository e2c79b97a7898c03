"""The tenant API's schedules on a real cell database (FastAPI's in-process client)."""

from __future__ import annotations

import datetime
import threading
import uuid
import zoneinfo
from collections.abc import Iterator
from typing import Any

import pytest
from cellapi import Cell
from cellfixtures import enqueue, fetch, write
from cellplane_cells.domain.schedules import ScheduleId, cron, dispatch_offset, first_after

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
