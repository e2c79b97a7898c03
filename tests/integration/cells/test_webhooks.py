"""The webhook relay on real Postgres, delivering to real HTTP receivers on 127.0.0.1.

Each receiver is a ``ThreadingHTTPServer`` that measures its own concurrency:
a request is in flight from the moment it arrives until its response is
written, so what it reports is what the endpoint really had to bear. Events
come from the queue's own statements (cancelled jobs write ``job.cancelled``
to the outbox).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psycopg
import pytest

from cellfixtures import enqueue, grant
from cellplane_cells.db import open_pool
from cellplane_cells.domain.breaker import BreakerPolicy
from cellplane_cells.domain.retry import RetryPolicy
from cellplane_cells.domain.signing import verify
from cellplane_cells.domain.plans import Plan
from cellplane_cells.errors import StaleEpochError
from cellplane_cells.queries import query
from cellplane_cells.relay import (
    ATTEMPT_HEADER, EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
    Relay, RelayConfig,
)
from cellplane_cells.tenants import TenantSpec, register_webhook, upsert_tenant
from cellplane_operator.localplane.ports import LOOPBACK, free_port

SECRET = "whsec_relay_test"
BREAKER = BreakerPolicy(failure_threshold=3, cool_down_seconds=0.3, max_cool_down_seconds=1.0)
FAST = RelayConfig(poll_seconds=0.02, request_timeout_seconds=5.0, lease_margin_seconds=2.0,
                   retry=RetryPolicy(base_seconds=0.02, cap_seconds=0.2), breaker=BREAKER)
# For tests about retries, not about the breaker: it never opens.
NO_BREAKER = replace(FAST, breaker=BreakerPolicy(failure_threshold=1000))


# --- a webhook receiver -----------------------------------------------------

@dataclass(frozen=True)
class Received:
    event_id: str
    event_type: str
    attempt: int
    timestamp: int
    signature: str
    body: bytes
    status: int
    in_flight_at_arrival: int
    """Requests in flight here when this one arrived, itself included."""
    ok_before_arrival: int
    """2xx responses fully written (since the last reset) before this one arrived."""


@dataclass
class Receiver:
    """A webhook endpoint on 127.0.0.1 that can be stopped and started again on its port."""

    respond: Callable[[str, int], int] = lambda event_id, nth: 200
    """Status for the nth request (from 1) carrying this event id."""
    hold_seconds: float = 0.03
    """The receiver's work per request; long enough that overlapping requests overlap here."""
    gate: threading.Event | None = None
    """If set, every request waits for it before answering."""
    port: int = field(default_factory=free_port)
    requests: list[Received] = field(default_factory=list)
    accepted: set[str] = field(default_factory=set)
    """The receiver's dedup-by-event-id set: every event it processed with a 2xx."""
    in_flight: int = 0
    peak: int = 0
    ok: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/hooks"

    def reset_measurements(self) -> None:
        with self.lock:
            assert self.in_flight == 0, "measurements restart only when nothing is in flight"
            self.requests.clear()
            self.peak = 0
            self.ok = 0

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one request per connection, so a stopped server has no
            # kept-alive connection left answering for it.
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                event_id = self.headers.get(EVENT_ID_HEADER, "")
                with receiver.lock:
                    receiver.in_flight += 1
                    receiver.peak = max(receiver.peak, receiver.in_flight)
                    arrival = (receiver.in_flight, receiver.ok)
                    receiver.seen[event_id] += 1
                    nth = receiver.seen[event_id]
                if receiver.gate is not None:
                    receiver.gate.wait(timeout=30)
                time.sleep(receiver.hold_seconds)  # the receiver's work, not synchronisation
                status = receiver.respond(event_id, nth)
                if 200 <= status < 300:
                    with receiver.lock:
                        receiver.accepted.add(event_id)
                # The response is written under the lock, so "done" here is
                # counted no later than the relay can have heard of it.
                with receiver.lock:
                    try:
                        self.send_response(status)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    except OSError:
                        pass  # the relay hung up (it died): the work is done all the same
                    receiver.in_flight -= 1
                    if 200 <= status < 300:
                        receiver.ok += 1
                    receiver.requests.append(Received(
                        event_id, self.headers.get(EVENT_TYPE_HEADER, ""),
                        int(self.headers.get(ATTEMPT_HEADER, "0")),
                        int(self.headers.get(TIMESTAMP_HEADER, "0")),
                        self.headers.get(SIGNATURE_HEADER, ""), body, status, *arrival))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((LOOPBACK, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=10)
            self._server = None

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.requests)


@contextmanager
def receiving(**kwargs: Any) -> Iterator[Receiver]:
    receiver = Receiver(**kwargs).start()
    try:
        yield receiver
    finally:
        if receiver.gate is not None:
            receiver.gate.set()
        receiver.stop()


# --- cell data and relays ---------------------------------------------------

def rows(conninfo: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return list(conn.execute(sql.encode(), params).fetchall())


def tenant_with_webhooks(conninfo: str, tenant_id: str, urls: list[str], *,
                         max_concurrency: int = 4) -> list[int]:
    with psycopg.connect(conninfo) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        conn.commit()
        upsert_tenant(conn, TenantSpec(tenant_id, Plan.PRO))
        return [register_webhook(conn, tenant_id, url, secret=SECRET,
                                 max_concurrency=max_concurrency, allow_private=True)
                for url in urls]


def emit(conninfo: str, tenant_id: str, count: int) -> set[str]:
    """``count`` job.cancelled events, written by the API's own cancel statement."""
    with psycopg.connect(conninfo) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        conn.commit()
        job_ids = enqueue(conn, tenant_id, count)
        with conn.transaction():
            for job_id in job_ids:
                conn.execute(query("cancel_queued"), {"tenant_id": tenant_id, "job_id": job_id})
    return {str(e) for (e,) in rows(conninfo, "SELECT event_id FROM outbox WHERE job_id = ANY(%s)",
                                    job_ids)}


def delivery_states(conninfo: str) -> Counter[str]:
    return Counter(status for (status,) in rows(conninfo, "SELECT status FROM deliveries"))


def all_delivered(conninfo: str, expected: int) -> Callable[[], bool]:
    return lambda: delivery_states(conninfo) == Counter({"delivered": expected})


async def eventually(condition: Callable[[], bool], *, what: str, timeout: float = 30.0) -> None:
    """Polls ``condition`` (in a thread: it may query Postgres) until it holds."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def relay(conninfo: str, config: RelayConfig = FAST, *,
                epoch: int = 1) -> AsyncIterator[Relay]:
    """A relay with a pool and HTTP client of its own, as a separate process would have."""
    pool = open_pool(conninfo, epoch=epoch, max_size=4, name=config.relay_id)
    try:
        async with httpx.AsyncClient() as http:
            yield Relay(pool, http, config)
    finally:
        pool.close()


@asynccontextmanager
async def running(conninfo: str, config: RelayConfig = FAST, *,
                  count: int = 1) -> AsyncIterator[list[Relay]]:
    """``count`` relays running side by side until the block ends."""
    stop = asyncio.Event()
    async with AsyncExitStack() as stack:
        relays = [await stack.enter_async_context(relay(conninfo, replace(config, relay_id=name)))
                  for name in ["relay-a", "relay-b", "relay-c"][:count]]
        tasks = [asyncio.create_task(r.run(stop)) for r in relays]
        try:
            yield relays
        finally:
            stop.set()
            await asyncio.gather(*tasks)


def breaker_row(conninfo: str, endpoint_id: int) -> tuple[str, int, int]:
    [row] = rows(conninfo, "SELECT breaker, failures, ramp_allowance FROM webhook_endpoints"
                           " WHERE endpoint_id = %s", endpoint_id)
    return str(row[0]), int(row[1]), int(row[2])


def leases_held(conninfo: str) -> int:
    return int(rows(conninfo, "SELECT count(*) FROM deliveries WHERE leased_until IS NOT NULL")[0][0])


# --- tests --------------------------------------------------------------------

async def test_fan_out_gives_each_event_one_delivery_per_endpoint_of_its_tenant(
    cell_db: str,
) -> None:
    acme = tenant_with_webhooks(cell_db, "acme", ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    globex = tenant_with_webhooks(cell_db, "globex", ["http://127.0.0.1:9/g"])
    tenant_with_webhooks(cell_db, "initech", [])
    events = {"acme": emit(cell_db, "acme", 30), "globex": emit(cell_db, "globex", 10),
              "initech": emit(cell_db, "initech", 5)}

    # Two relays fan out small batches concurrently; SKIP LOCKED splits the events.
    small = replace(FAST, fan_out_batch=4)
    relayed: list[int] = []

    async def drain(r: Relay) -> None:
        while taken := await r.fan_out():
            relayed.append(taken)

    async with relay(cell_db, small) as first, relay(cell_db, small) as second:
        await asyncio.gather(drain(first), drain(second))

    assert sum(relayed) == 45  # every event taken by exactly one relay
    assert rows(cell_db, "SELECT count(*) FROM outbox WHERE relayed_at IS NULL") == [(0,)]
    fanned: defaultdict[str, set[int]] = defaultdict(set)
    for event_id, endpoint_id, status, attempts in rows(
            cell_db, "SELECT event_id, endpoint_id, status, attempts FROM deliveries"):
        assert (status, attempts) == ("pending", 0)
        fanned[str(event_id)].add(endpoint_id)
    assert len(rows(cell_db, "SELECT 1 FROM deliveries")) == 30 * 2 + 10
    assert {e: fanned[e] for e in events["acme"]} == {e: set(acme) for e in events["acme"]}
    assert {e: fanned[e] for e in events["globex"]} == {e: set(globex) for e in events["globex"]}
    assert not events["initech"] & fanned.keys()


async def test_deliveries_are_signed_and_keep_their_event_id_and_body_across_retries(
    cell_db: str,
) -> None:
    # Every event fails twice (500) before the receiver takes it.
    with receiving(respond=lambda event_id, nth: 500 if nth <= 2 else 200) as receiver:
        [endpoint] = tenant_with_webhooks(cell_db, "acme", [receiver.url])
        events = emit(cell_db, "acme", 5)
        async with running(cell_db, NO_BREAKER):
            await eventually(all_delivered(cell_db, 5), what="every delivery delivered")
        calls = receiver.snapshot()

    assert receiver.accepted == events
    by_event: defaultdict[str, list[Received]] = defaultdict(list)
    for call in calls:
        assert verify(SECRET, call.body, timestamp=call.timestamp, signature=call.signature)
        assert not verify("another-secret", call.body, timestamp=call.timestamp,
                          signature=call.signature)
        assert not verify(SECRET, call.body + b" ", timestamp=call.timestamp,
                          signature=call.signature)
        assert abs(call.timestamp - time.time()) < 60
        body = json.loads(call.body)
        assert body["id"] == call.event_id and body["type"] == call.event_type == "job.cancelled"
        assert body["tenant"] == "acme" and body["data"]["status"] == "cancelled"
        by_event[call.event_id].append(call)
    assert by_event.keys() == events
    for attempts in by_event.values():
        # The same id and the very same bytes on every attempt, so receivers can dedupe.
        assert [(a.attempt, a.status) for a in attempts] == [(1, 500), (2, 500), (3, 200)]
        assert len({a.body for a in attempts}) == 1

    for event_id in events:
        [(status, attempts, code, delivered_at, error)] = rows(
            cell_db, "SELECT status, attempts, last_status_code, delivered_at, last_error"
                     " FROM deliveries WHERE event_id = %s AND endpoint_id = %s",
            uuid.UUID(event_id), endpoint)
        assert (status, attempts, code, error) == ("delivered", 3, 200, None)
        assert delivered_at is not None
        history = rows(cell_db, "SELECT attempt, outcome, status_code, finished_at IS NOT NULL"
                                " FROM delivery_attempts WHERE event_id = %s ORDER BY attempt",
                       uuid.UUID(event_id))
        assert history == [(1, "failed", 500, True), (2, "failed", 500, True),
                           (3, "delivered", 200, True)]
    assert leases_held(cell_db) == 0


async def test_rejections_are_dead_at_once_and_failures_after_max_attempts(cell_db: str) -> None:
    with receiving(respond=lambda e, n: 410) as gone, receiving(respond=lambda e, n: 503) as down:
        rejecting, failing = tenant_with_webhooks(cell_db, "acme", [gone.url, down.url])
        events = emit(cell_db, "acme", 3)
        async with running(cell_db, replace(NO_BREAKER, max_attempts=3)):
            await eventually(lambda: delivery_states(cell_db) == Counter({"dead": 6}),
                             what="every delivery dead")

    assert Counter(c.event_id for c in gone.snapshot()) == Counter({e: 1 for e in events})
    assert Counter(c.event_id for c in down.snapshot()) == Counter({e: 3 for e in events})
    outcomes = rows(cell_db, "SELECT d.endpoint_id, d.attempts, d.last_status_code,"
                             " array_agg(a.outcome ORDER BY a.attempt)"
                             " FROM deliveries d JOIN delivery_attempts a USING (event_id, endpoint_id)"
                             " GROUP BY d.event_id, 1, 2, 3")
    assert sorted(outcomes) == sorted([(rejecting, 1, 410, ["rejected"])] * 3
                                      + [(failing, 3, 503, ["failed"] * 3)] * 3)


async def test_each_endpoints_cap_holds_across_two_relays_under_a_backlog(cell_db: str) -> None:
    with receiving() as wide, receiving() as narrow:
        wide_id = tenant_with_webhooks(cell_db, "acme", [wide.url], max_concurrency=3)[0]
        narrow_id = tenant_with_webhooks(cell_db, "globex", [narrow.url], max_concurrency=1)[0]
        events = emit(cell_db, "acme", 60) | emit(cell_db, "globex", 15)
        async with running(cell_db, count=2) as relays:
            await eventually(all_delivered(cell_db, 75), what="every delivery delivered")
        # Both relays did part of the work: the cap held between them, not within one.
        attempts_by = dict(rows(cell_db, "SELECT relay, count(*) FROM delivery_attempts GROUP BY 1"))

    assert len(relays) == 2 and set(attempts_by) == {"relay-a", "relay-b"}
    assert wide.accepted | narrow.accepted == events
    assert len(wide.snapshot()) == 60 and len(narrow.snapshot()) == 15
    assert wide.peak == 3, "the cap is reached and never exceeded"
    assert narrow.peak == 1
    assert breaker_row(cell_db, wide_id)[0] == breaker_row(cell_db, narrow_id)[0] == "closed"


@pytest.mark.parametrize("outage", ["stopped", "503"])
async def test_an_outage_loses_nothing_and_the_recovery_is_ramped_not_flooded(
    cell_db: str, outage: str,
) -> None:
    cap = 8
    healthy = threading.Event()
    healthy.set()
    with receiving(respond=lambda e, n: 200 if healthy.is_set() else 503,
                   hold_seconds=0.1) as receiver:
        [endpoint] = tenant_with_webhooks(cell_db, "acme", [receiver.url], max_concurrency=cap)
        events = emit(cell_db, "acme", 5)
        async with running(cell_db, FAST):
            await eventually(lambda: receiver.accepted == events, what="the first events")

            if outage == "stopped":
                receiver.stop()
            else:
                healthy.clear()
            events |= emit(cell_db, "acme", 40)
            # The breaker opens, cools down, probes, fails and opens again.
            await eventually(lambda: breaker_row(cell_db, endpoint)[0] == "open"
                             and breaker_row(cell_db, endpoint)[1] > BREAKER.failure_threshold,
                             what="the breaker to open and a probe to fail")
            await eventually(lambda: leases_held(cell_db) == 0 and receiver.in_flight == 0,
                             what="no request in flight")
            failures_at_recovery = breaker_row(cell_db, endpoint)[1]

            receiver.reset_measurements()
            if outage == "stopped":
                receiver.start()
            else:
                healthy.set()
            await eventually(all_delivered(cell_db, 45), what="every delivery delivered")
        after = receiver.snapshot()

    # Nothing lost: the receiver's dedup set is exactly the outbox.
    assert receiver.accepted == events
    assert {str(e) for (e,) in rows(cell_db, "SELECT event_id FROM outbox")} == events
    # While open, deliveries waited: the only failed attempts are those that
    # opened the breaker, the ones already in flight then, and the probes.
    [(failed,)] = rows(cell_db, "SELECT count(*) FROM delivery_attempts WHERE outcome = 'failed'")
    assert failed <= failures_at_recovery + cap
    # No flood: after k successes the endpoint never had more than 1 + k requests
    # at once (the allowance doubles per round of successes, not per success).
    assert after and after[0].in_flight_at_arrival == 1
    for call in after:
        allowance = BREAKER.initial_allowance + (BREAKER.growth - 1) * call.ok_before_arrival
        assert call.in_flight_at_arrival <= min(cap, allowance), call
    # And it does ramp up. Not necessarily to the full cap as seen here: the relay
    # holds a slot from its claim until the outcome is recorded, a little longer
    # than the receiver holds the request.
    assert receiver.peak >= cap // 2, "the ramp grows towards the endpoint's cap"
    assert breaker_row(cell_db, endpoint) == ("closed", 0, 0)


async def test_an_open_breaker_survives_a_relay_restart_and_the_next_relay_ramps_up(
    cell_db: str,
) -> None:
    healthy = threading.Event()
    config = replace(FAST, breaker=replace(BREAKER, failure_threshold=2, cool_down_seconds=1.5,
                                           max_cool_down_seconds=1.5))
    with receiving(respond=lambda e, n: 200 if healthy.is_set() else 503) as receiver:
        [endpoint] = tenant_with_webhooks(cell_db, "acme", [receiver.url], max_concurrency=8)
        events = emit(cell_db, "acme", 20)
        async with relay(cell_db, config) as first:
            deadline = time.monotonic() + 30
            while breaker_row(cell_db, endpoint)[0] != "open":
                assert time.monotonic() < deadline, "the breaker never opened"
                await first.run_once()
        healthy.set()
        sent_while_down = len(receiver.snapshot())

        async with relay(cell_db, config) as second:
            # The new relay reads the breaker from the database: open, so it sends nothing.
            [(still_cooling,)] = rows(cell_db, "SELECT open_until > now() FROM webhook_endpoints")
            assert still_cooling
            assert await second.run_once() == 0
            assert len(receiver.snapshot()) == sent_while_down
            # After the cool-down: one probe, then 2, then 4, then the whole cap.
            rounds: list[int] = []
            deadline = time.monotonic() + 30
            while sum(rounds) < 20:
                assert time.monotonic() < deadline, rounds
                attempted = await second.run_once()
                if attempted or rounds:
                    rounds.append(attempted)
                else:
                    await asyncio.sleep(0.02)

    assert rounds == [1, 2, 4, 8, 5]
    assert receiver.accepted == events
    assert breaker_row(cell_db, endpoint) == ("closed", 0, 0)


async def test_a_fenced_relay_sends_nothing_and_stops(cell_db: str) -> None:
    with receiving() as receiver:
        tenant_with_webhooks(cell_db, "acme", [receiver.url])
        events = emit(cell_db, "acme", 3)
        async with relay(cell_db) as stale:
            assert await stale.fan_out() == 3
            grant(cell_db, epoch=2, seconds=3600)  # the placement group moved on
            with pytest.raises(StaleEpochError):
                await stale.run_once()
            assert stale.fenced is not None
            await asyncio.wait_for(stale.run(asyncio.Event()), timeout=10)  # returns by itself
        assert receiver.snapshot() == []

        async with relay(cell_db, epoch=2) as current:
            assert await current.run_once() == 3
    assert receiver.accepted == events


async def test_a_relay_that_dies_mid_request_is_reaped_and_its_events_sent_again(
    cell_db: str,
) -> None:
    # A short lease, so the dead relay's deliveries come back quickly.
    config = replace(FAST, request_timeout_seconds=0.5, lease_margin_seconds=0.3)
    gate = threading.Event()
    with receiving(gate=gate) as receiver:
        tenant_with_webhooks(cell_db, "acme", [receiver.url], max_concurrency=3)
        events = emit(cell_db, "acme", 3)
        async with relay(cell_db, config) as doomed:
            stop = asyncio.Event()
            task = asyncio.create_task(doomed.run(stop))
            await eventually(lambda: receiver.in_flight == 3, what="three requests held")
            task.cancel()  # the relay dies with its requests sent and nothing recorded
            await asyncio.gather(task, return_exceptions=True)
        gate.set()  # the receiver finishes the work it was given
        await eventually(lambda: receiver.accepted == events and receiver.in_flight == 0,
                         what="the receiver to process the first copies")

        async with running(cell_db, config):
            await eventually(all_delivered(cell_db, 3), what="every delivery delivered")

    # At least once: each event came twice, with the same id, and the dedup set is exact.
    assert Counter(c.event_id for c in receiver.snapshot()) == Counter({e: 2 for e in events})
    assert receiver.accepted == events
    history = rows(cell_db, "SELECT array_agg(outcome ORDER BY attempt) FROM delivery_attempts"
                            " GROUP BY event_id")
    assert history == [(["lost", "delivered"],)] * 3
