"""The webhook relay: outbox events become signed HTTP deliveries, at least once, never a flood.

Three steps, each its own transaction (statements in ``sql/relay.sql``):

1. **Fan-out**: every unrelayed outbox event gets one pending delivery per
   webhook endpoint of its tenant, and is marked relayed.
2. **Claim**: for each endpoint with due deliveries, the breaker
   (``domain/breaker.py``) says how many requests may be in flight; the
   database says how many are (a lease per delivery in flight); the difference
   is claimed. The endpoint's row is locked meanwhile, so the cap holds across
   every relay of the cell, not only inside this process.
3. **Deliver**: POST the event, then record the attempt's outcome and the
   breaker's next state together, under the endpoint's row lock.

Receivers see the same body bytes on every attempt and the event's stable id
in ``X-Cellplane-Event-Id``: they deduplicate on it, since at-least-once means
a relay that dies after sending but before recording sends again.

The pool is the cell's ordinary synchronous pool (``db.open_pool``), the one
that declares the placement-group epoch on every connection, so statements
run in worker threads and only HTTP is asynchronous. A claim is a write: a
fenced relay (stale epoch, expired lease) sends nothing, and stops.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from cellplane_cells.db import ThreadedDatabase, translate_errors
from cellplane_cells.domain import breaker as breakers
from cellplane_cells.domain.breaker import Breaker, BreakerPolicy, BreakerState
from cellplane_cells.domain.retry import RetryPolicy, decide
from cellplane_cells.domain.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from cellplane_cells.egress import EgressRefused
from cellplane_cells.errors import NotWritableError, TenantMovingError
from cellplane_cells.metrics import DELIVERIES
from cellplane_cells.queries import query

__all__ = [
    "RelayConfig", "Relay", "Delivery", "EVENT_ID_HEADER", "EVENT_TYPE_HEADER",
    "ATTEMPT_HEADER", "SIGNATURE_HEADER", "TIMESTAMP_HEADER",
]

log = logging.getLogger(__name__)

EVENT_ID_HEADER = "X-Cellplane-Event-Id"
EVENT_TYPE_HEADER = "X-Cellplane-Event-Type"
ATTEMPT_HEADER = "X-Cellplane-Delivery-Attempt"
T = TypeVar("T")

Status = Literal["pending", "delivered", "dead"]
Outcome = Literal["delivered", "failed", "rejected"]


def _webhook_retry() -> RetryPolicy:
    # Slower than a step's retries: a receiver that is down is usually down
    # for minutes, and the breaker already keeps attempts off it meanwhile.
    return RetryPolicy(base_seconds=5.0, cap_seconds=3600.0)


@dataclass(frozen=True)
class RelayConfig:
    relay_id: str = "relay"
    """Written on every lease and attempt, for people reading the tables."""
    max_attempts: int = 16
    """Attempts per delivery before it is dead; attempts wait while the breaker is open."""
    retry: RetryPolicy = field(default_factory=_webhook_retry)
    """Backoff (full jitter) between a delivery's failed attempts."""
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    """When an endpoint's breaker opens, how long it cools down, how fast it ramps up."""
    request_timeout_seconds: float = 10.0
    """A whole request, connect to status line; no answer by then is a failure."""
    lease_margin_seconds: float = 10.0
    """Added to the timeout for a delivery's lease: covers the claim's round trip and
    recording the outcome. A lease that runs out is reaped and the delivery sent again."""
    max_in_flight: int = 100
    """Requests this relay has open at once, over all endpoints (size the HTTP client's
    connection limits to match)."""
    endpoint_batch: int = 50
    """Endpoints one claim considers; those waiting longest first."""
    fan_out_batch: int = 500
    """Outbox events one fan-out takes."""
    reap_batch: int = 500
    """Expired leases one reaper pass returns."""
    poll_seconds: float = 0.5
    """Pause between rounds when nothing finished meanwhile; new events, backoffs that
    end and cool-downs that end are noticed this late at most."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.request_timeout_seconds <= 0 or self.lease_margin_seconds <= 0:
            raise ValueError("request_timeout_seconds and lease_margin_seconds must be positive")
        for name in ("max_in_flight", "endpoint_batch", "fan_out_batch", "reap_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def lease_seconds(self) -> float:
        return self.request_timeout_seconds + self.lease_margin_seconds


@dataclass(frozen=True)
class Delivery:
    """One claimed attempt at one event for one endpoint."""

    event_id: uuid.UUID
    endpoint_id: int
    attempt: int
    event_type: str
    url: str
    secret: str = field(repr=False)
    body: bytes = field(repr=False)


@dataclass(frozen=True)
class _Answer:
    status_code: int | None
    """None: no answer (refused, reset, timed out)."""
    error: str | None
    retry_after_seconds: float | None
    refused: bool = False
    """The cell's URL policy refused the endpoint's address: nothing was sent."""


@dataclass(frozen=True)
class _Verdict:
    status: Status
    outcome: Outcome
    delay_seconds: float


def _verdict(delivery: Delivery, answer: _Answer, config: RelayConfig,
             rng: random.Random) -> _Verdict:
    """What becomes of the delivery after this answer; pure, on top of ``retry.decide``."""
    code = answer.status_code
    if code is not None and 200 <= code < 300:
        return _Verdict("delivered", "delivered", 0.0)
    if answer.refused:
        return _Verdict("dead", "rejected", 0.0)
    decided = decide(attempt=delivery.attempt, status_code=code, policy=config.retry, rng=rng,
                     retry_after_seconds=answer.retry_after_seconds)
    if decided.permanent:
        return _Verdict("dead", "rejected", 0.0)
    if delivery.attempt >= config.max_attempts:
        return _Verdict("dead", "failed", 0.0)
    return _Verdict("pending", "failed", decided.delay_seconds)


class Relay:
    """Fans out the outbox and delivers it; ``run`` until stopped, or ``run_once`` per round."""

    def __init__(self, pool: ConnectionPool, http: httpx.AsyncClient,
                 config: RelayConfig | None = None, *, rng: random.Random | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._config = config or RelayConfig()
        self._rng = rng or random.Random()
        # Only for the signature's timestamp, which receivers compare with their
        # own clocks; every other time is the database's.
        self._wall_clock = wall_clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        # Remembers when the database refused this relay's writes; it then claims nothing more.
        self._db = ThreadedDatabase(pool, component=f"relay {self._config.relay_id}")

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def fenced(self) -> NotWritableError | None:
        return self._db.fenced

    async def fan_out(self) -> int:
        """One fan-out batch; returns the events it relayed (0: the outbox is drained)."""
        events, deliveries = await self._db(_fan_out, batch=self._config.fan_out_batch)
        if events:
            log.debug("fanned out %d events into %d deliveries", events, deliveries)
        return events

    async def reap(self) -> int:
        """Puts back the deliveries whose relay never reported their outcome; returns how many."""
        lost = await self._db(_reap, batch=self._config.reap_batch,
                              max_attempts=self._config.max_attempts)
        if lost:
            DELIVERIES.labels("lost").inc(lost)
            log.warning("%d deliveries' leases ran out unreported; they go out again", lost)
        return lost

    async def dispatch(self) -> list[asyncio.Task[None]]:
        """Claims what the endpoints' breakers and caps allow; starts each delivery."""
        budget = self._config.max_in_flight - len(self._tasks)
        if budget <= 0 or self.fenced is not None:
            return []
        claimed = await self._db(_claim, config=self._config, budget=budget)
        started = []
        for delivery in claimed:
            task = asyncio.create_task(self._deliver(delivery))
            self._tasks.add(task)
            task.add_done_callback(self._finished)
            started.append(task)
        return started

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # A freed slot is worth a claim now rather than at the next poll.
        self._wake.set()

    async def run_once(self) -> int:
        """One fan-out, one reaper pass and one claim, whose deliveries it awaits.

        Returns the deliveries attempted. Raises ``NotWritableError`` when fenced.
        """
        await self.fan_out()
        await self.reap()
        started = await self.dispatch()
        if started:
            await asyncio.gather(*started)
        return len(started)

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop`` is set (or the relay is fenced), claiming as slots free up.

        On stop, requests already sent finish and are recorded (each is bounded by
        the request timeout). Cancelled instead, it abandons them: their leases run
        out and they go out again, as after a crash.
        """
        # Fan-out and reaping run once per poll interval; a finished delivery
        # wakes only a claim, for the slot it freed.
        housekept_at: float | None = None
        try:
            while not stop.is_set() and self.fenced is None:
                self._wake.clear()
                try:
                    now = time.monotonic()
                    if housekept_at is None or now - housekept_at >= self._config.poll_seconds:
                        housekept_at = now
                        await self.fan_out()
                        await self.reap()
                    await self.dispatch()
                except NotWritableError:
                    break
                except TenantMovingError as error:
                    # A tenant froze for a move between a batch's read and its write;
                    # the next round passes it by.
                    log.info("relay round refused for a tenant being moved: %s", error)
                except psycopg.OperationalError as error:
                    log.warning("relay round failed, retrying: %s", error)
                await self._pause(stop)
        except BaseException:  # cancelled (or a bug): requests in flight are abandoned
            abandoned = list(self._tasks)
            for task in abandoned:
                task.cancel()
            await asyncio.gather(*abandoned, return_exceptions=True)
            raise
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _pause(self, stop: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=self._config.poll_seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _deliver(self, delivery: Delivery) -> None:
        answer = await self._post(delivery)
        verdict = _verdict(delivery, answer, self._config, self._rng)
        DELIVERIES.labels(verdict.outcome).inc()
        try:
            await self._db(_record, delivery, answer, verdict, policy=self._config.breaker)
        except NotWritableError:
            pass  # fenced, and logged by _db; the lease runs out and the new owner delivers
        except TenantMovingError:
            # The tenant is cutting over: the event goes to its new cell undelivered,
            # and is sent again from there (receivers deduplicate by event id).
            log.info("outcome of event %s for endpoint %d not recorded: its tenant is being moved",
                     delivery.event_id, delivery.endpoint_id)
        except psycopg.OperationalError as error:
            log.warning("outcome of event %s for endpoint %d not recorded (%s); its lease will"
                        " run out and it goes out again", delivery.event_id, delivery.endpoint_id,
                        error)
        except Exception:
            # Nobody awaits a delivery's task under `run`: an error not logged here goes unseen.
            log.exception("outcome of event %s for endpoint %d not recorded",
                          delivery.event_id, delivery.endpoint_id)

    async def _post(self, delivery: Delivery) -> _Answer:
        timestamp = int(self._wall_clock())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "cellplane-webhooks/1",
            EVENT_ID_HEADER: str(delivery.event_id),
            EVENT_TYPE_HEADER: delivery.event_type,
            ATTEMPT_HEADER: str(delivery.attempt),
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(delivery.secret, delivery.body, timestamp=timestamp),
        }
        timeout = self._config.request_timeout_seconds
        try:
            # httpx's timeouts are per phase; this one bounds the whole request,
            # which the lease on the delivery relies on.
            async with asyncio.timeout(timeout):
                # Streamed and never read: the status is the answer, and a
                # receiver's body, however large, is not our concern.
                async with self._http.stream("POST", delivery.url, content=delivery.body,
                                             headers=headers, timeout=timeout) as response:
                    code = response.status_code
                    error = None if 200 <= code < 300 else f"endpoint answered {code}"
                    return _Answer(code, error, _retry_after(response))
        except TimeoutError:
            return _Answer(None, f"no answer within {timeout:g}s", None)
        except EgressRefused as refused:
            return _Answer(None, str(refused)[:2000], None, refused=True)
        except (httpx.HTTPError, httpx.InvalidURL) as error:
            return _Answer(None, f"{type(error).__name__}: {error}"[:2000], None)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from webhook receivers, and backoff covers it


def _breaker_of(row: dict[str, Any]) -> Breaker:
    return Breaker(BreakerState(row["breaker"]), failures=int(row["failures"]),
                   open_until=row["open_until"], allowance=int(row["ramp_allowance"]))


def _save_breaker(cursor: psycopg.Cursor[Any], endpoint_id: int, before: Breaker,
                  after: Breaker) -> None:
    if after == before:
        return
    cursor.execute(query("save_breaker"), {
        "endpoint_id": endpoint_id, "state": after.state.value, "failures": after.failures,
        "open_until": after.open_until, "allowance": after.allowance})
    if after.state is not before.state:
        level = logging.WARNING if after.state is BreakerState.OPEN else logging.INFO
        log.log(level, "webhook endpoint %d: breaker %s -> %s%s", endpoint_id,
                before.state.value, after.state.value,
                f" until {after.open_until.isoformat()}" if after.open_until else "")


def _event_body(row: dict[str, Any]) -> bytes:
    created: datetime.datetime = row["created_at"]
    event = {
        "id": str(row["event_id"]),
        "type": row["kind"],
        "tenant": row["tenant_id"],
        "job_id": str(row["job_id"]) if row["job_id"] is not None else None,
        # In UTC whatever the session's time zone: every attempt sends the same bytes.
        "created_at": created.astimezone(datetime.timezone.utc).isoformat(),
        "data": row["payload"],
    }
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def _fan_out(conn: psycopg.Connection[Any], *, batch: int) -> tuple[int, int]:
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(query("fan_out_events"), {"batch": batch}).fetchone()
        assert row is not None
        return int(row["events"]), int(row["deliveries"])


def _reap(conn: psycopg.Connection[Any], *, batch: int, max_attempts: int) -> int:
    with translate_errors(), conn.transaction(), conn.cursor() as cursor:
        rows = cursor.execute(query("reap_lost_deliveries"),
                              {"batch": batch, "max_attempts": max_attempts}).fetchall()
        return len(rows)


def _claim(conn: psycopg.Connection[Any], *, config: RelayConfig, budget: int) -> list[Delivery]:
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        locked = [int(r["endpoint_id"]) for r in cursor.execute(
            query("lock_due_endpoints"), {"batch": config.endpoint_batch}).fetchall()]
        if not locked:
            return []
        loads = {int(r["endpoint_id"]): r for r in cursor.execute(
            query("endpoint_loads"), {"endpoint_ids": locked}).fetchall()}
        endpoint_ids: list[int] = []
        slots: list[int] = []
        for endpoint_id in locked:  # longest-waiting first, for the budget's sake
            row = loads[endpoint_id]
            before = _breaker_of(row)
            now: datetime.datetime = row["now"]
            current = breakers.advance(before, now=now, policy=config.breaker)
            _save_breaker(cursor, endpoint_id, before, current)
            allowed = breakers.capacity(current, now=now, max_concurrency=row["max_concurrency"],
                                        policy=config.breaker)
            free = min(allowed - int(row["in_flight"]), budget)
            if free > 0:
                endpoint_ids.append(endpoint_id)
                slots.append(free)
                budget -= free
        if not endpoint_ids:
            return []
        rows = cursor.execute(query("claim_deliveries"), {
            "endpoint_ids": endpoint_ids, "slots": slots, "relay": config.relay_id,
            "lease_seconds": config.lease_seconds}).fetchall()
        return [Delivery(event_id=r["event_id"], endpoint_id=int(r["endpoint_id"]),
                         attempt=int(r["attempt"]), event_type=str(r["kind"]),
                         url=str(loads[int(r["endpoint_id"])]["url"]),
                         secret=str(loads[int(r["endpoint_id"])]["secret"]),
                         body=_event_body(r))
                for r in rows]


def _record(conn: psycopg.Connection[Any], delivery: Delivery, answer: _Answer,
            verdict: _Verdict, *, policy: BreakerPolicy) -> bool:
    """The attempt's outcome and the breaker's next state; False if the lease was lost."""
    with translate_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(query("lock_endpoint"),
                             {"endpoint_id": delivery.endpoint_id}).fetchone()
        if row is None:
            return False  # the endpoint was removed, and its deliveries with it
        before = _breaker_of(row)
        if breakers.is_failure(answer.status_code):
            after = breakers.on_failure(before, now=row["now"], policy=policy)
        else:
            after = breakers.on_success(before, now=row["now"],
                                        max_concurrency=row["max_concurrency"], policy=policy)
        _save_breaker(cursor, delivery.endpoint_id, before, after)
        finished = cursor.execute(query("finish_delivery"), {
            "event_id": delivery.event_id, "endpoint_id": delivery.endpoint_id,
            "attempt": delivery.attempt, "status": verdict.status, "outcome": verdict.outcome,
            "delay_seconds": verdict.delay_seconds, "status_code": answer.status_code,
            "error": answer.error}).fetchall()
        if not finished:
            log.warning("event %s for endpoint %d: lease lost before attempt %d was recorded",
                        delivery.event_id, delivery.endpoint_id, delivery.attempt)
        return bool(finished)
