"""The schedule dispatcher: due occurrences become queued jobs, exactly one per occurrence.

Runs beside the workers. Each pass, in one transaction: lock a batch of due
schedules (due by the database's ``now()``, never a process clock), let the
domain plan each one (the misfire policy after an outage or a pause, the next
occurrence from the scheduled time), insert one ``schedule_runs`` row and one
job per run, carrying the run's idempotency key, and move the schedules on.
The inserts and the advance are one statement each for the whole batch: a
top-of-the-minute burst is thousands of schedules due in the same second
(``benchmarks/schedules.py``).
Two dispatchers never take the same schedule (row locks, SKIP LOCKED), and if
one did, the run's primary key and the conditional advance would turn the
second copy into nothing. The workers then claim the jobs like any other.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from dataclasses import dataclass, field
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


@dataclass
class _Pass:
    """One pass's planned runs, column by column (the statement unnests them)."""

    schedule_ids: list[ScheduleId] = field(default_factory=list)
    scheduled_fors: list[datetime.datetime] = field(default_factory=list)
    tenant_ids: list[str] = field(default_factory=list)
    job_ids: list[uuid.UUID] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    payloads: list[Jsonb] = field(default_factory=list)
    max_attempts: list[int] = field(default_factory=list)
    priorities: list[str] = field(default_factory=list)

    def add(self, row: dict[str, Any], scheduled_for: datetime.datetime) -> None:
        schedule_id = ScheduleId(row["schedule_id"])
        self.schedule_ids.append(schedule_id)
        self.scheduled_fors.append(scheduled_for)
        self.tenant_ids.append(row["tenant_id"])
        self.job_ids.append(uuid.uuid4())
        self.keys.append(idempotency_key(schedule_id, scheduled_for))
        self.targets.append(row["target"])
        self.payloads.append(Jsonb(row["payload"]))
        self.max_attempts.append(row["max_attempts"])
        self.priorities.append(row["priority"])


def dispatch_due(conn: psycopg.Connection[Any], *, batch: int) -> Dispatched:
    """One pass over due schedules, in one transaction: the batch's runs, jobs
    and events are inserted by one statement, their steps by a second, and the
    schedules moved on by a third."""
    lags: list[float] = []
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(query("lock_due_schedules"), {"batch": batch}).fetchall()
        if not rows:
            return Dispatched(schedules=0, jobs=0)
        plans = {row["schedule_id"]: (row, plan_due(
            timing_of(row), next_at=row["next_at"], offset=row["dispatch_offset"],
            misfire=misfire_of(row), now=row["now"])) for row in rows}
        planned = _Pass()
        for row, plan in plans.values():
            for scheduled_for in plan.runs:
                planned.add(row, scheduled_for)
        made = (cursor.execute(query("insert_runs"), vars(planned)).fetchall()
                if planned.job_ids else [])
        if made:
            cursor.execute(query("insert_run_steps"), {
                "job_ids": [run["job_id"] for run in made],
                "keys": [run["idempotency_key"] for run in made]})
        # An occurrence dispatched before made no run now; the schedule's
        # latest job is that of its latest run made in this pass, if any.
        latest: dict[uuid.UUID, tuple[datetime.datetime, uuid.UUID]] = {}
        for run in made:
            row, _ = plans[run["schedule_id"]]
            lags.append((row["now"] - (run["scheduled_for"] + row["dispatch_offset"]))
                        .total_seconds())
            known = latest.get(run["schedule_id"])
            if known is None or run["scheduled_for"] > known[0]:
                latest[run["schedule_id"]] = (run["scheduled_for"], run["job_id"])
        ids = list(plans)
        advanced = cursor.execute(query("advance_schedules"), {
            "schedule_ids": ids,
            "next_ats": [plans[i][1].next_at for i in ids],
            "last_job_ids": [latest[i][1] if i in latest else None for i in ids],
            "planned_froms": [plans[i][0]["next_at"] for i in ids]}).fetchall()
        # The rows are locked by this transaction since they were read: nothing
        # can have moved one on meanwhile.
        assert len(advanced) == len(ids), f"{len(ids) - len(advanced)} schedules moved while locked"
    # Observed once committed: a pass that rolled back queued nothing.
    for lag in lags:
        SCHEDULE_DISPATCH_LAG.observe(lag)
    return Dispatched(schedules=len(rows), jobs=len(made))


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
