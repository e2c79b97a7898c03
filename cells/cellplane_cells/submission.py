"""Accepting a job: idempotency, the token bucket, the reservation and the job, in one transaction.

A resubmission under the same ``Idempotency-Key`` gets the stored response of
the first (same status code, same body); a different body under the same key is
a conflict. A new submission takes a token (429 when the bucket is empty) and
reserves the estimate (402 when it does not fit) in the same transaction that
inserts the job, its steps, its outbox event and the key, so a refused
submission leaves nothing behind and an accepted one leaves everything.
A CRITICAL job is refused (409) before any of that when the tenant has no
strict allowance (domain/strict_allowance.py).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cellplane_cells.db import translate_errors
from cellplane_cells.domain.priorities import Priority
from cellplane_cells.domain.strict_allowance import job_admission
from cellplane_cells.errors import (
    ConflictError,
    InsufficientFundsError,
    RateLimitedError,
    StrictAllowanceExceededError,
    TargetRefusedError,
)
from cellplane_cells.metrics import refuse_submission
from cellplane_cells.queries import query

__all__ = ["JobRequest", "StoredResponse", "submit", "request_hash"]


@dataclass(frozen=True)
class JobRequest:
    target: str
    payload: Any
    steps: int
    max_attempts: int
    estimate: int
    expires_in_seconds: int | None
    priority: Priority = Priority.DEFAULT


@dataclass(frozen=True)
class StoredResponse:
    status_code: int
    body: dict[str, Any]
    replayed: bool


def request_hash(request: JobRequest) -> bytes:
    fields = {name: value for name, value in request.__dict__.items() if name != "priority"}
    # A DEFAULT job hashes as before priorities existed, so a submission retried
    # across the upgrade still matches the key it was first stored under.
    if request.priority is not Priority.DEFAULT:
        fields["priority"] = request.priority.value
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).digest()


def _replay(cursor: psycopg.Cursor[dict[str, Any]], tenant_id: str, key: str,
            digest: bytes) -> StoredResponse | None:
    stored = cursor.execute(query("stored_response"), {"tenant_id": tenant_id, "key": key}).fetchone()
    if stored is None:
        return None
    if bytes(stored["request_hash"]) != digest:
        raise ConflictError(f"Idempotency-Key {key!r} was used before with a different request",
                            code="idempotency_key_reused")
    return StoredResponse(int(stored["status_code"]), dict(stored["response"]), replayed=True)


def _admit_critical(cursor: psycopg.Cursor[dict[str, Any]], tenant_id: str) -> None:
    """Before the token is taken: a refused CRITICAL job spends none. No lock: a job
    takes no slot of the allowance, it only needs one to exist."""
    counted = cursor.execute(query("strict_in_use"), {"tenant_id": tenant_id,
                                                      "schedule_id": None}).fetchone()
    assert counted is not None  # the caller's key named the tenant
    refused = job_admission(priority=Priority.CRITICAL, allowance=counted["allowance"],
                            in_use=counted["in_use"])
    if refused is not None:
        refuse_submission("strict_allowance_exceeded", tenant_id)
        raise StrictAllowanceExceededError(refused.message, allowance=refused.allowance,
                                           in_use=refused.in_use)


def submit(conn: psycopg.Connection[Any], *, tenant_id: str, key: str,
           request: JobRequest) -> StoredResponse:
    digest = request_hash(request)
    with translate_errors(), conn.cursor(row_factory=dict_row) as cursor:
        replayed = _replay(cursor, tenant_id, key, digest)
        if replayed is not None:
            return replayed
        if cursor.execute(query("target_url"), {"tenant_id": tenant_id,
                                                "target": request.target}).fetchone() is None:
            refuse_submission("target_unknown", tenant_id)
            raise TargetRefusedError(f"target {request.target!r} is not registered for this tenant",
                                     code="target_not_registered")
        if request.priority is Priority.CRITICAL:
            _admit_critical(cursor, tenant_id)
        # The token is taken in a statement of its own, before the transaction:
        # the bucket's row lock is then held for one statement, not for the
        # whole submission, so one hot tenant's requests do not queue on it
        # while holding pooled connections. A submission refused later (402)
        # has still spent its token, as a rate limit on requests should.
        if cursor.execute(query("take_token"), {"tenant_id": tenant_id}).fetchone() is None:
            wait = cursor.execute(query("token_wait"), {"tenant_id": tenant_id}).fetchone()
            refuse_submission("rate_limited", tenant_id)
            seconds = float(next(iter(wait.values()))) if wait else 1.0
            raise RateLimitedError("submission rate limit reached",
                                   retry_after_seconds=max(seconds, 0.001))
        remembered: dict[str, Any] | None = None
        with conn.transaction():
            job_id = uuid.uuid4()
            params: dict[str, Any] = {
                "tenant_id": tenant_id, "job_id": job_id, "target": request.target,
                "step_count": request.steps, "payload": Jsonb(request.payload),
                "max_attempts": request.max_attempts, "estimate": request.estimate,
                "expires_in_seconds": request.expires_in_seconds,
                "priority": request.priority.value,
            }
            if cursor.execute(query("reserve"), params).fetchone() is None:
                refuse_submission("insufficient_funds", tenant_id)
                raise InsufficientFundsError(
                    f"the estimate of {request.estimate} does not fit the tenant's available "
                    "balance or daily spend limit")
            created = cursor.execute(query("insert_job"), params).fetchone()
            assert created is not None
            cursor.execute(query("insert_steps"), params)
            cursor.execute(query("insert_accepted_event"), params)
            body = {"job_id": str(job_id), "status": "queued",
                    "created_at": created["created_at"].isoformat()}
            remembered = cursor.execute(query("remember_response"), {
                "tenant_id": tenant_id, "key": key, "request_hash": digest, "job_id": job_id,
                "status_code": 202, "response": Jsonb(body)}).fetchone()
            if remembered is None:
                # A concurrent request with the same key committed first: undo
                # ours entirely and answer with the winner's response.
                raise psycopg.Rollback()
        if remembered is None:
            replayed = _replay(cursor, tenant_id, key, digest)
            assert replayed is not None
            return replayed
        return StoredResponse(202, body, replayed=False)
