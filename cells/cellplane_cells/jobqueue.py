"""The job queue's operations, each one named statement in ``sql/queue.sql``.

Functions take a connection from the caller's pool (``db.open_pool``, in
autocommit) and each runs as one statement or one explicit transaction; the
fencing trigger's refusals surface as ``NotWritableError``.
A claim-scoped write answers False (or None) when the claim is no longer the
caller's: reaped, cancelled, or finished by someone else.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cellplane_cells.db import translate_errors
from cellplane_cells.domain.priorities import Priority
from cellplane_cells.domain.reaping import LeaseCensus
from cellplane_cells.queries import query

__all__ = [
    "ClaimedJob", "Step", "claimable_classes", "claim", "heartbeat", "steps_of", "save_step", "complete", "release",
    "finish_cancelled", "refund", "lease_census", "grant_recovery_grace", "reap", "expire_queued",
    "fix_counters",
]


@dataclass(frozen=True)
class ClaimedJob:
    job_id: uuid.UUID
    tenant_id: str
    claim_epoch: int
    target: str
    payload: Any
    step_count: int
    attempts: int
    max_attempts: int
    expires_at: datetime.datetime | None
    priority: Priority
    waited_seconds: float
    """From when the job was due (queued, or its retry's time) to this claim."""


@dataclass(frozen=True)
class Step:
    step: int
    idempotency_key: str
    done: bool
    result: Any


def _run(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """One named statement, atomic by itself (pooled connections are in autocommit)."""
    with translate_errors(), conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute(query(name), params)
        return cursor.fetchall() if cursor.description else []


def claimable_classes(conn: psycopg.Connection[Any]) -> set[Priority]:
    """The classes with a due job of a tenant that may run one now."""
    return {Priority(row["priority"]) for row in _run(conn, "claimable_classes", {})}


def claim(conn: psycopg.Connection[Any], *, worker: str, batch: int, lease_seconds: float,
          priority: Priority = Priority.DEFAULT) -> list[ClaimedJob]:
    """Up to ``batch`` due jobs of one class, one per tenant, in the tenants' turn order."""
    rows = _run(conn, "claim_jobs", {"worker": worker, "batch": batch,
                                     "lease_seconds": lease_seconds,
                                     "priority": priority.value})
    return [ClaimedJob(**{**row, "priority": Priority(row["priority"])}) for row in rows]


def heartbeat(conn: psycopg.Connection[Any], job: ClaimedJob, *,
              lease_seconds: float) -> bool | None:
    """Extends the lease. None: the claim is lost; otherwise whether a cancel was asked."""
    rows = _run(conn, "heartbeat", {"job_id": job.job_id, "claim_epoch": job.claim_epoch,
                                    "lease_seconds": lease_seconds})
    return bool(rows[0]["cancel_requested"]) if rows else None


def steps_of(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> list[Step]:
    with conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(query("pending_steps"), {"job_id": job_id}).fetchall()
    conn.commit()
    return [Step(r["step"], r["idempotency_key"], r["status"] == "succeeded", r["result"])
            for r in rows]


def save_step(conn: psycopg.Connection[Any], job: ClaimedJob, *, step: int, result: Any) -> bool:
    return bool(_run(conn, "save_step", {"job_id": job.job_id, "claim_epoch": job.claim_epoch,
                                         "step": step, "result": Jsonb(result)}))


def complete(conn: psycopg.Connection[Any], job: ClaimedJob, *, cost: int) -> bool:
    return bool(_run(conn, "complete_job", {"job_id": job.job_id,
                                            "claim_epoch": job.claim_epoch, "cost": cost}))


def release(conn: psycopg.Connection[Any], job: ClaimedJob, *, permanent: bool,
            delay_seconds: float, error: str, error_code: str) -> str | None:
    """Back to the queue or to dead-letter; returns the new status, None if not ours.

    A job that goes dead is refunded in the same transaction.
    """
    params = {"job_id": job.job_id, "claim_epoch": job.claim_epoch, "permanent": permanent,
              "delay_seconds": delay_seconds, "error": error[:2000], "error_code": error_code}
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(query("release_job"), params).fetchall()
        if not rows:
            return None
        status = str(rows[0]["status"])
        if status == "dead":
            cursor.execute(query("refund_job"), {"job_id": job.job_id})
        return status


def finish_cancelled(conn: psycopg.Connection[Any], job: ClaimedJob, *, call_sent: bool) -> bool:
    with translate_errors(), conn.transaction(), conn.cursor() as cursor:
        done = cursor.execute(query("finish_cancelled"), {
            "job_id": job.job_id, "claim_epoch": job.claim_epoch, "call_sent": call_sent,
        }).fetchall()
        if done:
            cursor.execute(query("refund_job"), {"job_id": job.job_id})
        return bool(done)


def refund(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> int:
    """Refunds a failed job's reservation once; returns what this call paid (0 if not first)."""
    rows = _run(conn, "refund_job", {"job_id": job_id})
    return int(rows[0]["amount"]) if rows else 0


def lease_census(conn: psycopg.Connection[Any]) -> LeaseCensus:
    """The running and expired claims, and the database's clock (of the caller's transaction)."""
    [row] = _run(conn, "lease_census", {})
    return LeaseCensus(now=row["now"], running=int(row["running"]), expired=int(row["expired"]))


def grant_recovery_grace(conn: psycopg.Connection[Any], *, grace_seconds: float) -> int:
    """Gives every expired claim a lease of ``grace_seconds`` from now; returns how many."""
    return len(_run(conn, "grant_recovery_grace", {"grace_seconds": grace_seconds}))


def reap(conn: psycopg.Connection[Any], *, batch: int = 500) -> list[dict[str, Any]]:
    """Returns up to ``batch`` expired claims to the queue, the oldest lease first;
    dead-lettered ones are refunded."""
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(query("reap_expired_claims"), {"batch": batch}).fetchall()
        for row in rows:
            if row["status"] == "dead":
                cursor.execute(query("refund_job"), {"job_id": row["job_id"]})
        return rows


def expire_queued(conn: psycopg.Connection[Any], *, batch: int = 500) -> int:
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(query("expire_queued_jobs"), {"batch": batch}).fetchall()
        for row in rows:
            cursor.execute(query("refund_job"), {"job_id": row["job_id"]})
        return len(rows)


def fix_counters(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Corrects any tenant's running counter that drifted; returns the corrections."""
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute(query("lock_all_tenants"))
        rows = cursor.execute(query("fix_running_counters")).fetchall()
        return {row["tenant_id"]: row["n"] for row in rows}
