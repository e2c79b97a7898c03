"""A job's slot on its target, taken before a call and given back after it, in the cell's Postgres.

Every worker process of the cell shares one limit, one hold and one breaker
per target (``target_limits``) and one count of calls in flight
(``target_calls``); the decisions are ``domain/aimd.py``'s, made under the
target's row lock with the database's ``now()``.

``take_slot`` either takes a slot or sends the job back to the queue until
the target can take it (``sql/targets.sql``'s ``defer_job``: not an attempt),
in one transaction. ``give_back`` records the call's outcome (the limit, the
hold, the breaker) and frees the slot, in one transaction; when the answer
closes the target (a Retry-After hold, the breaker opening), every queued job
of the target is pushed back to the end in the same statement, so none is
claimed only to be turned away. A worker that dies
between the two leaks nothing: its job is reaped with a new claim epoch, and
a slot counts only under the claim that took it.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from cellplane_cells.db import translate_errors
from cellplane_cells.domain import aimd
from cellplane_cells.domain import breaker as breakers
from cellplane_cells.domain.aimd import AimdPolicy, Admission, DeferReason, TargetLimit
from cellplane_cells.domain.breaker import Breaker, BreakerPolicy, BreakerState
from cellplane_cells.jobqueue import ClaimedJob
from cellplane_cells.queries import query

__all__ = ["Slot", "Deferred", "Answer", "take_slot", "give_back", "UnknownTarget"]


class UnknownTarget(LookupError):
    """The job's target is not registered (any more): no limit row can exist for it."""


@dataclass(frozen=True)
class Slot:
    started_at: datetime.datetime
    """When the call started, by the database's clock."""


@dataclass(frozen=True)
class Deferred:
    reason: DeferReason
    until: datetime.datetime
    """When the job is claimable again."""


@dataclass(frozen=True)
class Answer:
    """What a call got: a status, or none (``timed_out`` says whether its timeout ran out)."""
    status_code: int | None
    timed_out: bool = False
    retry_after_seconds: float | None = None


def _limit_of(row: dict[str, Any]) -> TargetLimit:
    return TargetLimit(limit=float(row["concurrency_limit"]),
                       max_concurrency=int(row["max_concurrency"]),
                       decreased_at=row["decreased_at"], hold_until=row["hold_until"])


def _breaker_of(row: dict[str, Any]) -> Breaker:
    return Breaker(BreakerState(row["breaker"]), failures=int(row["failures"]),
                   open_until=row["open_until"], allowance=int(row["ramp_allowance"]))


def _key(job: ClaimedJob) -> dict[str, Any]:
    return {"tenant_id": job.tenant_id, "target": job.target}


def _lock(cursor: psycopg.Cursor[Any], job: ClaimedJob) -> dict[str, Any] | None:
    row: dict[str, Any] | None = cursor.execute(query("lock_target_limit"), _key(job)).fetchone()
    return row


def _save(cursor: psycopg.Cursor[Any], job: ClaimedJob, limit: TargetLimit,
          breaker: Breaker) -> None:
    cursor.execute(query("save_target_limit"), {
        **_key(job), "limit": limit.limit, "decreased_at": limit.decreased_at,
        "hold_until": limit.hold_until, "breaker": breaker.state.value,
        "failures": breaker.failures, "open_until": breaker.open_until,
        "allowance": breaker.allowance,
    })


def take_slot(conn: psycopg.Connection[Any], job: ClaimedJob, *, policy: AimdPolicy,
              breaker_policy: BreakerPolicy, busy_wait_scale: float = 1.0
              ) -> Slot | Deferred | None:
    """A slot on the job's target, or the job deferred; None if the claim is no longer the
    caller's. ``busy_wait_scale`` stretches a limit wait (the worker's jitter, so jobs
    turned away together come back apart)."""
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        row = _lock(cursor, job)
        if row is None:
            # The target's first call in this cell: its row, from the policy.
            cursor.execute(query("ensure_target_limit"), {
                **_key(job), "initial": policy.initial,
                "max_concurrency": max(1, math.floor(policy.ceiling))})
            row = _lock(cursor, job)
        if row is None:
            raise UnknownTarget(f"target {job.target!r} of tenant {job.tenant_id} is not registered")
        counted = cursor.execute(query("target_calls_in_flight"), _key(job)).fetchone()
        assert counted is not None
        before = _breaker_of(row)
        admission = aimd.admit(_limit_of(row), before, in_flight=int(counted["in_flight"]),
                               now=row["now"], policy=policy, breaker_policy=breaker_policy)
        if admission.breaker != before:
            _save(cursor, job, _limit_of(row), admission.breaker)
        if admission.admitted:
            cursor.execute(query("sweep_target_calls"), _key(job))
            taken = cursor.execute(query("take_target_call"), {
                "job_id": job.job_id, "claim_epoch": job.claim_epoch}).fetchone()
            if taken is None:
                return None     # the claim was lost meanwhile: nothing to call or defer
            return Slot(taken["started_at"])
        return _defer(cursor, job, admission, now=row["now"], busy_wait_scale=busy_wait_scale)


def _defer(cursor: psycopg.Cursor[Any], job: ClaimedJob, admission: Admission, *,
           now: datetime.datetime, busy_wait_scale: float) -> Deferred | None:
    assert admission.defer is not None and admission.until is not None
    until = admission.until
    if admission.defer is DeferReason.LIMIT:
        until = now + (until - now) * busy_wait_scale
    deferred = cursor.execute(query("defer_job"), {
        "job_id": job.job_id, "claim_epoch": job.claim_epoch, "until": until}).fetchall()
    if admission.defer is not DeferReason.LIMIT:
        # Jobs queued since the hold (or the opening) began wait with this one.
        _hold_queued_jobs(cursor, job, until)
    return Deferred(admission.defer, until) if deferred else None


def _hold_queued_jobs(cursor: psycopg.Cursor[Any], job: ClaimedJob,
                      until: datetime.datetime) -> None:
    cursor.execute(query("hold_target_jobs"), {**_key(job), "until": until})


def give_back(conn: psycopg.Connection[Any], job: ClaimedJob, slot: Slot,
              answer: Answer | None, *, policy: AimdPolicy,
              breaker_policy: BreakerPolicy) -> float:
    """Frees the job's slot; with an ``answer``, first applies it to the target's limit,
    hold and breaker (None: nothing was sent, nothing learnt). Returns how many seconds
    the target stays closed to every job, by the database's clock (0: it is not)."""
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        row = _lock(cursor, job)
        cursor.execute(query("give_back_target_call"),
                       {"job_id": job.job_id, "claim_epoch": job.claim_epoch})
        if row is None:
            return 0.0
        limit = _limit_of(row)
        now = row["now"]
        if answer is None:
            return _seconds_until(aimd.closed_until(limit, _breaker_of(row)), now)
        signal = aimd.signal_of(answer.status_code, timed_out=answer.timed_out)
        after = aimd.on_outcome(limit, signal, call_started_at=slot.started_at, now=now,
                                policy=policy, status_code=answer.status_code,
                                retry_after_seconds=answer.retry_after_seconds)
        before = state = _breaker_of(row)
        failed = aimd.breaker_verdict(answer.status_code,
                                      retry_after_seconds=answer.retry_after_seconds)
        if failed is True:
            state = breakers.on_failure(before, now=now, policy=breaker_policy)
        elif failed is False:
            state = breakers.on_success(before, now=now, max_concurrency=limit.max_concurrency,
                                        policy=breaker_policy)
        if after != limit or state != before:
            _save(cursor, job, after, state)
        closed = aimd.closed_until(after, state)
        if closed is not None and closed != aimd.closed_until(limit, before):
            # The target just asked for a pause (or its breaker opened): every job of
            # it waits, not only this one.
            _hold_queued_jobs(cursor, job, closed)
        return _seconds_until(closed, now)


def _seconds_until(end: datetime.datetime | None, now: datetime.datetime) -> float:
    return 0.0 if end is None else max((end - now).total_seconds(), 0.0)
