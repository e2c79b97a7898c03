"""A tenant's schedules in the cell database: create, read, list, replace, pause, resume, cancel.

The decisions (occurrences, DST, offsets) are ``domain/schedules.py``'s; this
module reads the database's clock, calls them, and writes the outcome. An
update is refused (409) while the job of the schedule's latest occurrence is
queued or running: the edit would otherwise race the run it is meant to
change, and the tenant is told to try again once the run has finished.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cellplane_cells.db import translate_errors
from cellplane_cells.domain.priorities import Priority
from cellplane_cells.domain.schedules import (
    MisfirePolicy, MisfireRule, ScheduleId, ScheduleKind, Timing, dispatch_offset, first_occurrence,
)
from cellplane_cells.errors import ConflictError, NotFoundError, TargetRefusedError
from cellplane_cells.queries import query

__all__ = ["ScheduleSpec", "StateChange", "CreateKey", "Created", "create_schedule",
           "get_schedule", "list_schedules", "replace_schedule", "change_state", "schedule_runs",
           "timing_of", "misfire_of"]


@dataclass(frozen=True)
class ScheduleSpec:
    """What a tenant asks for, validated (the timing by the domain's parsers)."""

    timing: Timing
    target: str
    payload: Any
    max_attempts: int
    misfire: MisfireRule
    dispatch_window_seconds: int
    priority: Priority = Priority.DEFAULT
    """The class every run's job is queued in."""


@dataclass(frozen=True)
class CreateKey:
    """A create request's ``Idempotency-Key`` and the hash of its body."""

    key: str
    request_hash: bytes


@dataclass(frozen=True)
class Created:
    row: dict[str, Any]
    replayed: bool
    """True when an earlier create with the same key made the schedule."""


class StateChange(Enum):
    """(the state it sets, the states it applies to). Asking for the state a schedule
    is already in answers it unchanged, so a retried request is harmless."""

    PAUSE = ("paused", ("active", "paused"))
    RESUME = ("active", ("paused", "active"))
    CANCEL = ("cancelled", ("active", "paused", "cancelled"))


def timing_of(row: dict[str, Any]) -> Timing:
    """A stored schedule's timing; the row was validated when it was written."""
    return Timing(ScheduleKind(row["kind"]), row["time_zone"], cron=row["cron"], run_at=row["run_at"])


def misfire_of(row: dict[str, Any]) -> MisfireRule:
    return MisfireRule(MisfirePolicy(row["misfire_policy"]),
                       max_catch_up_runs=row["max_catch_up_runs"])


def _params(tenant_id: str, schedule_id: ScheduleId, spec: ScheduleSpec,
            now: datetime.datetime, state: str) -> dict[str, Any]:
    return {
        "schedule_id": schedule_id, "tenant_id": tenant_id, "kind": spec.timing.kind.value,
        "cron": spec.timing.cron, "run_at": spec.timing.run_at, "time_zone": spec.timing.time_zone,
        "target": spec.target, "payload": Jsonb(spec.payload), "max_attempts": spec.max_attempts,
        "misfire_policy": spec.misfire.policy.value,
        "max_catch_up_runs": spec.misfire.max_catch_up_runs,
        "dispatch_window_seconds": spec.dispatch_window_seconds,
        "priority": spec.priority.value,
        "dispatch_offset": dispatch_offset(schedule_id, spec.dispatch_window_seconds),
        "state": state, "next_at": first_occurrence(spec.timing, now),
    }


def _check_target(cursor: psycopg.Cursor[dict[str, Any]], tenant_id: str, target: str) -> None:
    if cursor.execute(query("target_url"), {"tenant_id": tenant_id, "target": target}).fetchone() is None:
        raise TargetRefusedError(f"target {target!r} is not registered for this tenant",
                                 code="target_not_registered")


def _now(cursor: psycopg.Cursor[dict[str, Any]]) -> datetime.datetime:
    row = cursor.execute(query("database_now")).fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


def create_schedule(conn: psycopg.Connection[Any], tenant_id: str, spec: ScheduleSpec,
                    key: CreateKey | None = None) -> Created:
    """A new active schedule; with a key, the one an earlier create with it made."""
    schedule_id = ScheduleId(uuid.uuid4())
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        _check_target(cursor, tenant_id, spec.target)
        params = {**_params(tenant_id, schedule_id, spec, _now(cursor), "active"),
                  "create_key": key.key if key else None,
                  "create_hash": key.request_hash if key else None}
        row = cursor.execute(query("insert_schedule"), params).fetchone()
        if row is not None:
            return Created(row, replayed=False)
        assert key is not None  # only a keyed insert conflicts
        earlier = cursor.execute(query("schedule_by_create_key"), params).fetchone()
    assert earlier is not None
    if bytes(earlier["create_hash"]) != key.request_hash:
        raise ConflictError(f"Idempotency-Key {key.key!r} was used before with a different request",
                            code="idempotency_key_reused")
    return Created(earlier, replayed=True)


def get_schedule(conn: psycopg.Connection[Any], tenant_id: str,
                 schedule_id: uuid.UUID) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(query("get_schedule"), {"tenant_id": tenant_id,
                                                     "schedule_id": schedule_id}).fetchone()
    if row is None:
        raise NotFoundError("no such schedule")
    return row


def list_schedules(conn: psycopg.Connection[Any], tenant_id: str, *, state: str | None,
                   after: tuple[datetime.datetime, uuid.UUID] | None,
                   limit: int) -> list[dict[str, Any]]:
    after_created, after_schedule = after if after else (None, None)
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(query("list_schedules"), {
            "tenant_id": tenant_id, "state": state, "after_created": after_created,
            "after_schedule": after_schedule, "limit": limit}).fetchall()


def replace_schedule(conn: psycopg.Connection[Any], tenant_id: str, schedule_id: uuid.UUID,
                     spec: ScheduleSpec) -> dict[str, Any]:
    """Replaces what the schedule does and when; its id, state and run history stay.
    The next occurrence is the new timing's first after now."""
    key = {"tenant_id": tenant_id, "schedule_id": schedule_id}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        current = cursor.execute(query("lock_schedule"), key).fetchone()
        if current is None:
            raise NotFoundError("no such schedule")
        if current["state"] not in ("active", "paused"):
            raise ConflictError(f"the schedule is {current['state']}", code="schedule_finished")
        busy = cursor.execute(query("schedule_busy"), {"job_id": current["last_job_id"]}).fetchone()
        if busy is not None and busy["busy"]:
            raise ConflictError("the schedule's current occurrence is running; update it once "
                                "that run has finished", code="schedule_running")
        _check_target(cursor, tenant_id, spec.target)
        params = _params(tenant_id, ScheduleId(schedule_id), spec, _now(cursor), current["state"])
        row = cursor.execute(query("replace_schedule"), params).fetchone()
    assert row is not None
    return row


def change_state(conn: psycopg.Connection[Any], tenant_id: str, schedule_id: uuid.UUID,
                 change: StateChange) -> dict[str, Any]:
    state, applies_to = change.value
    key = {"tenant_id": tenant_id, "schedule_id": schedule_id}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(query("set_schedule_state"),
                             {**key, "state": state, "from": list(applies_to)}).fetchone()
        if row is not None:
            return row
        current = cursor.execute(query("get_schedule"), key).fetchone()
    if current is None:
        raise NotFoundError("no such schedule")
    raise ConflictError(f"a {current['state']} schedule cannot be {state}",
                        code="schedule_state_conflict")


def schedule_runs(conn: psycopg.Connection[Any], tenant_id: str, schedule_id: uuid.UUID, *,
                  before: datetime.datetime | None, limit: int) -> list[dict[str, Any]]:
    get_schedule(conn, tenant_id, schedule_id)  # 404 for another tenant's id
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(query("schedule_runs"), {
            "schedule_id": schedule_id, "before": before, "limit": limit}).fetchall()
