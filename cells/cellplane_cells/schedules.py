"""A tenant's schedules in the cell database: create, read, list, replace, pause, resume, cancel.

The decisions (occurrences, DST, offsets) are ``domain/schedules.py``'s; this
module reads the database's clock, calls them, and writes the outcome. An
update is refused (409) while the job of the schedule's latest occurrence is
queued or running: the edit would otherwise race the run it is meant to
change, and the tenant is told to try again once the run has finished.

A write that may add an active strict schedule (a create, an update or a
resume of a strict or CRITICAL one) takes the tenant's strict lock first,
then counts, then writes, in one transaction: two such writes of one tenant
cannot both take its last slot (``domain/strict_allowance.py``). The lock
comes before any schedule's row lock, in every path, so a resume and an
update of the same schedule never wait for each other in a circle.
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
from cellplane_cells.domain.strict_allowance import is_strict, schedule_admission
from cellplane_cells.errors import (
    ConflictError, NotFoundError, StrictAllowanceExceededError, TargetRefusedError,
)
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


def _allowance_applies(priority: Priority, dispatch_window_seconds: int) -> bool:
    """Does the strict allowance decide on a schedule like this (strict, or CRITICAL)?"""
    return is_strict(dispatch_window_seconds) or priority is Priority.CRITICAL


def _lock_strict_allowance(cursor: psycopg.Cursor[dict[str, Any]], tenant_id: str) -> None:
    cursor.execute(query("lock_strict_allowance"), {"tenant_id": tenant_id})


def _admit(cursor: psycopg.Cursor[dict[str, Any]], tenant_id: str, *, priority: Priority,
           dispatch_window_seconds: int, active: bool, schedule_id: uuid.UUID | None,
           holds_a_slot: bool = False) -> None:
    """Raises ``StrictAllowanceExceededError`` if the tenant may not have this schedule;
    under the tenant's strict lock (``_lock_strict_allowance``)."""
    counted = cursor.execute(query("strict_in_use"), {"tenant_id": tenant_id,
                                                      "schedule_id": schedule_id}).fetchone()
    assert counted is not None  # the caller's key named the tenant
    refused = schedule_admission(priority=priority, dispatch_window_seconds=dispatch_window_seconds,
                                 active=active, allowance=counted["allowance"],
                                 others_in_use=counted["in_use"], holds_a_slot=holds_a_slot)
    if refused is not None:
        raise StrictAllowanceExceededError(refused.message, allowance=refused.allowance,
                                           in_use=refused.in_use)


def create_schedule(conn: psycopg.Connection[Any], tenant_id: str, spec: ScheduleSpec,
                    key: CreateKey | None = None) -> Created:
    """A new active schedule; with a key, the one an earlier create with it made."""
    schedule_id = ScheduleId(uuid.uuid4())
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        _check_target(cursor, tenant_id, spec.target)
        params = {**_params(tenant_id, schedule_id, spec, _now(cursor), "active"),
                  "create_key": key.key if key else None,
                  "create_hash": key.request_hash if key else None}
        earlier = None
        if _allowance_applies(spec.priority, spec.dispatch_window_seconds):
            _lock_strict_allowance(cursor, tenant_id)
            # A retried create whose first try took the last slot answers that
            # schedule, not a 409 (a same-key create still in flight holds the lock).
            if key is not None:
                earlier = cursor.execute(query("schedule_by_create_key"), params).fetchone()
            if earlier is None:
                _admit(cursor, tenant_id, priority=spec.priority,
                       dispatch_window_seconds=spec.dispatch_window_seconds, active=True,
                       schedule_id=None)
        if earlier is None:
            row = cursor.execute(query("insert_schedule"), params).fetchone()
            if row is not None:
                return Created(row, replayed=False)
            assert key is not None  # only a keyed insert conflicts
            earlier = cursor.execute(query("schedule_by_create_key"), params).fetchone()
    assert earlier is not None and key is not None
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
        checked = _allowance_applies(spec.priority, spec.dispatch_window_seconds)
        if checked:
            _lock_strict_allowance(cursor, tenant_id)
        current = cursor.execute(query("lock_schedule"), key).fetchone()
        if current is None:
            raise NotFoundError("no such schedule")
        if current["state"] not in ("active", "paused"):
            raise ConflictError(f"the schedule is {current['state']}", code="schedule_finished")
        if checked:
            _admit(cursor, tenant_id, priority=spec.priority,
                   dispatch_window_seconds=spec.dispatch_window_seconds,
                   active=current["state"] == "active", schedule_id=schedule_id,
                   holds_a_slot=(current["state"] == "active"
                                 and is_strict(current["dispatch_window_seconds"])))
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
        if change is StateChange.RESUME:
            _admit_resume(cursor, tenant_id, schedule_id)
        row = cursor.execute(query("set_schedule_state"),
                             {**key, "state": state, "from": list(applies_to)}).fetchone()
        if row is not None:
            return row
        current = cursor.execute(query("get_schedule"), key).fetchone()
    if current is None:
        raise NotFoundError("no such schedule")
    raise ConflictError(f"a {current['state']} schedule cannot be {state}",
                        code="schedule_state_conflict")


def _admit_resume(cursor: psycopg.Cursor[dict[str, Any]], tenant_id: str,
                  schedule_id: uuid.UUID) -> None:
    """A paused strict (or CRITICAL) schedule takes a slot again when resumed. The lock is
    taken for every resume, before the schedule's row: which schedule is strict is only
    known once its row is read, and the lock must come first (the module's lock order)."""
    _lock_strict_allowance(cursor, tenant_id)
    current = cursor.execute(query("lock_schedule"), {"tenant_id": tenant_id,
                                                      "schedule_id": schedule_id}).fetchone()
    if (current is not None and current["state"] == "paused"
            and _allowance_applies(Priority(current["priority"]),
                                   current["dispatch_window_seconds"])):
        _admit(cursor, tenant_id, priority=Priority(current["priority"]),
               dispatch_window_seconds=current["dispatch_window_seconds"], active=True,
               schedule_id=schedule_id)


def schedule_runs(conn: psycopg.Connection[Any], tenant_id: str, schedule_id: uuid.UUID, *,
                  before: datetime.datetime | None, limit: int) -> list[dict[str, Any]]:
    get_schedule(conn, tenant_id, schedule_id)  # 404 for another tenant's id
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(query("schedule_runs"), {
            "schedule_id": schedule_id, "before": before, "limit": limit}).fetchall()
