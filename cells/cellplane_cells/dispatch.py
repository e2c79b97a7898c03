"""The schedule dispatcher: due occurrences become queued jobs, exactly one per occurrence.

Runs beside the workers. Each pass, in one transaction: lock a batch of due
schedules (due by the database's ``now()``, never a process clock), let the
domain plan each one (the misfire policy after an outage or a pause, the next
occurrence from the scheduled time), insert one ``schedule_runs`` row and one
job per run, carrying the run's idempotency key, and move the schedule on.
Two dispatchers never take the same schedule (row locks, SKIP LOCKED), and if
one did, the run's primary key and the conditional advance would turn the
second copy into nothing. The workers then claim the jobs like any other.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from cellplane_cells.db import ThreadedDatabase, translate_errors
from cellplane_cells.domain.schedules import ScheduleId, idempotency_key, plan_due
from cellplane_cells.errors import NotWritableError, TenantMovingError
from cellplane_cells.metrics import SCHEDULE_DISPATCH_LAG
from cellplane_cells.queries import query
from cellplane_cells.schedules import misfire_of, timing_of

__all__ = ["DispatcherConfig", "Dispatched", "dispatch_due", "prune_runs", "Dispatcher"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DispatcherConfig:
    batch: int = 100
    """Most schedules one pass locks and dispatches (one transaction)."""
    poll_seconds: float = 0.5
    """Pause between passes when the last one found less than a full batch."""
    run_retention_days: int = 30
    """Run history older than this is deleted (the jobs are not)."""
    prune_seconds: float = 3600.0
    """Interval of the history's pruning."""


@dataclass(frozen=True)
class Dispatched:
    schedules: int
    """Schedules locked and planned in the pass."""
    jobs: int
    """Jobs created: one per run, none for an occurrence already dispatched."""


def _dispatch_one(cursor: psycopg.Cursor[dict[str, Any]], row: dict[str, Any],
                  lags: list[float]) -> int:
    plan = plan_due(timing_of(row), next_at=row["next_at"], offset=row["dispatch_offset"],
                    misfire=misfire_of(row), now=row["now"])
    schedule_id = ScheduleId(row["schedule_id"])
    last_job: uuid.UUID | None = None
    created = 0
    for scheduled_for in plan.runs:
        job_id = uuid.uuid4()
        key = idempotency_key(schedule_id, scheduled_for)
        params = {"schedule_id": schedule_id, "scheduled_for": scheduled_for,
                  "tenant_id": row["tenant_id"], "job_id": job_id, "idempotency_key": key,
                  "target": row["target"], "payload": Jsonb(row["payload"]),
                  "max_attempts": row["max_attempts"], "priority": row["priority"]}
        if cursor.execute(query("insert_run"), params).fetchone() is None:
            continue  # this occurrence has its job already
        cursor.execute(query("insert_scheduled_job"), params)
        cursor.execute(query("insert_scheduled_step"), params)
        cursor.execute(query("insert_accepted_event"), params)
        last_job = job_id
        created += 1
        lags.append((row["now"] - (scheduled_for + row["dispatch_offset"])).total_seconds())
    advanced = cursor.execute(query("advance_schedule"), {
        "schedule_id": schedule_id, "next_at": plan.next_at, "last_job_id": last_job,
        "planned_from": row["next_at"]}).fetchone()
    # The row is locked by this transaction since it was read: nothing can
    # have moved it on meanwhile.
    assert advanced is not None, f"schedule {schedule_id} moved while locked"
    return created


def dispatch_due(conn: psycopg.Connection[Any], *, batch: int) -> Dispatched:
    """One pass over due schedules, in one transaction."""
    jobs = 0
    lags: list[float] = []
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(query("lock_due_schedules"), {"batch": batch}).fetchall()
        for row in rows:
            jobs += _dispatch_one(cursor, row, lags)
    # Observed once committed: a pass that rolled back queued nothing.
    for lag in lags:
        SCHEDULE_DISPATCH_LAG.observe(lag)
    return Dispatched(schedules=len(rows), jobs=jobs)


def prune_runs(conn: psycopg.Connection[Any], *, days: int) -> int:
    with translate_errors(), conn.transaction():
        return conn.execute(query("prune_schedule_runs"), {"days": days}).rowcount


class Dispatcher:
    def __init__(self, pool: ConnectionPool, config: DispatcherConfig, *, name: str) -> None:
        self._config = config
        self._db = ThreadedDatabase(pool, component=f"dispatcher {name}")

    @property
    def fenced(self) -> NotWritableError | None:
        return self._db.fenced

    async def run(self, stop: asyncio.Event) -> None:
        pruned_at: float | None = None
        loop = asyncio.get_running_loop()
        while not stop.is_set() and self.fenced is None:
            full = False
            try:
                done = await self._db(dispatch_due, batch=self._config.batch)
                full = done.schedules >= self._config.batch
                if done.jobs:
                    log.info("dispatched %d jobs from %d schedules", done.jobs, done.schedules)
                if pruned_at is None or loop.time() - pruned_at >= self._config.prune_seconds:
                    pruned_at = loop.time()
                    await self._db(prune_runs, days=self._config.run_retention_days)
            except NotWritableError:
                return
            except TenantMovingError as error:
                # A tenant froze between the batch's read and its write; its
                # schedules wait (the next pass passes the tenant by).
                log.info("dispatch pass refused for a tenant being moved, retrying: %s", error)
            except psycopg.OperationalError as error:
                log.warning("dispatch pass failed, retrying: %s", error)
            if full:
                continue  # more is due now: no pause
            try:
                await asyncio.wait_for(stop.wait(), self._config.poll_seconds)
            except asyncio.TimeoutError:
                pass
