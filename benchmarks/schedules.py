"""The top-of-the-minute burst: 100,000 active schedules, 10,000 of them due in the same second.

    .venv/bin/python benchmarks/schedules.py [--schedules 100000] [--burst 10000]
        [--strict-share 0.5] [--window 300] [--steady 3000] [--variants ours,seed]

Starts its own PostgreSQL 15 on loopback (fsync off, as the local control plane
runs it) and, per variant, builds one cell database: 200 enterprise tenants and
``--schedules`` active CRON schedules, loaded with one COPY (a fast path for the
setup only: every column is what ``create_schedule`` would write, the dispatch
offset from the domain's own ``dispatch_offset``):

* the burst: ``--burst`` daily schedules (``M H * * *`` in UTC) whose next
  occurrence is the same top of a minute T0, at least ``--lead`` seconds after
  the load; a share ``--strict-share`` of them strict (window 0, CRITICAL), the
  rest with a ``--window``-second dispatch window (DEFAULT);
* the steady load beside it: ``--steady`` minutely schedules (``* * * * *``,
  a 60-second window, DEFAULT), about ``--steady / 60`` runs a second, from T0 on;
* the rest: daily schedules due later in the day, never during the run; they
  are there so the due-schedule index holds 100,000 active rows.

Then the real ``Dispatcher`` (``--dispatchers`` of them, each with its own pool,
as each ``cellplane cell work`` process runs one) turns due occurrences into
jobs, and ``--workers`` worker threads claim and finish them: no target is
called (a no-op job), so the run measures the dispatcher and the queue, not an
HTTP round trip. Variants differ only in the workers' claim:

* ``ours``: the worker's real claim round (``worker.claim_round``: the classes
  with work, then ``claim_jobs`` class by class, floors 2/2/2/1 of
  ``--slots``) and the real ``complete_job``;
* ``seed``: the seed's single-claim query and its completion (two UPDATEs),
  imported from ``claims.py``; it knows no classes.

Everything is measured afterwards from the database, on its clock:
``schedule_runs.dispatched_at`` (the dispatcher's transaction's ``now()``) and
``jobs.started_at`` (the first claim's ``now()``) against the occurrence's
scheduled time and its offset in the window. A benchmark, not a test: it prints
markdown tables and judges only the stated goals.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from cellplane_cells import jobqueue
from cellplane_cells.db import open_pool
from cellplane_cells.dispatch import Dispatcher, DispatcherConfig
from cellplane_cells.domain.plans import Plan
from cellplane_cells.domain.schedules import ScheduleId, dispatch_offset
from cellplane_cells.migrate import migrate
from cellplane_cells.tenants import TenantSpec, upsert_tenant
from cellplane_cells.worker import WorkerConfig, claim_round
from cellplane_operator.localplane import LocalControlPlane, PostgresInstance
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from claims import WorkerStats, seed_round
from procstat import machine_busy_seconds, self_cpu_seconds, tree_cpu_seconds

CELL = "cell-bench"
EPOCH = 1
LEASE_SECONDS = 300.0
STRICT_LAG_GOAL_SECONDS = 1.0
UTC = datetime.timezone.utc

GRANT_EPOCH = "SELECT cellplane_grant(%(epoch)s, make_interval(secs => %(seconds)s))"

# The setup's fast path: every schedule in one COPY instead of 100,000 API calls.
COPY_SCHEDULES = """
COPY schedules (schedule_id, tenant_id, kind, cron, time_zone, target, payload, max_attempts,
                misfire_policy, max_catch_up_runs, dispatch_window_seconds, dispatch_offset,
                priority, state, next_at, dispatch_at)
FROM STDIN
"""

# Every run with its schedule's group (the payload says which), window and
# offset, and its job's first claim: the whole measurement, on the database's clock.
RUNS = """
SELECT s.payload->>'group', s.dispatch_window_seconds,
       extract(epoch FROM r.scheduled_for)::float8,
       extract(epoch FROM s.dispatch_offset)::float8,
       extract(epoch FROM r.dispatched_at)::float8,
       extract(epoch FROM j.started_at)::float8
  FROM schedule_runs r JOIN schedules s USING (schedule_id) JOIN jobs j USING (job_id)
"""

# Occurrences due (by more than a second) that no dispatcher turned into a job.
OVERDUE = """
SELECT count(*) FROM schedules
 WHERE state = 'active' AND dispatch_at < now() - interval '1 second'
"""

PROGRESS = """
SELECT (SELECT count(*) FROM schedule_runs),
       (SELECT count(*) FROM jobs WHERE status = 'queued'),
       (SELECT count(*) FROM jobs WHERE status = 'succeeded'),
       (SELECT count(*) FROM jobs WHERE status <> 'queued' AND payload->>'group' LIKE 'burst%'),
       extract(epoch FROM now())::float8
"""


@dataclass(frozen=True)
class BenchConfig:
    schedules: int
    burst: int
    strict_share: float
    window: int
    steady: int
    tenants: int
    dispatchers: int
    dispatch_batch: int
    workers: int
    slots: int
    lead: float
    settle: float
    max_drain: float
    variants: tuple[str, ...]


@dataclass
class Tally:
    claimed: int = 0
    error: Exception | None = None


@dataclass(frozen=True)
class Run:
    group: str
    window: int
    scheduled: float
    offset: float
    dispatched: float
    started: float | None


@dataclass
class Outcome:
    variant: str
    burst_at: float
    runs: list[Run]
    overdue: int
    claimed: int
    elapsed: float
    postgres_cores: float
    client_cores: float
    other_cores: float
    setup_seconds: float
    errors: list[Exception] = field(default_factory=list)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the database ----------------------------------------------------------------

def _grant(conninfo: str, seconds: float) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(GRANT_EPOCH, {"epoch": EPOCH, "seconds": seconds})


def _schedule_row(n: int, tenants: int, *, group: str, cron: str, window: int, priority: str,
                  next_at: datetime.datetime) -> tuple[Any, ...]:
    schedule_id = ScheduleId(uuid.uuid4())
    offset = dispatch_offset(schedule_id, window)
    return (schedule_id, f"tenant-{n % tenants:03d}", "CRON", cron, "UTC", "default",
            f'{{"group": "{group}"}}', 5, "RUN_ONCE", 10, window, offset, priority, "active",
            next_at, next_at + offset)


def schedule_rows(config: BenchConfig, burst_at: datetime.datetime,
                  run_minutes: int) -> list[tuple[Any, ...]]:
    """The burst, the steady minutely load, and the rest due later in the day."""
    rng = random.Random(19)
    strict = round(config.burst * config.strict_share)
    rows = []
    daily = f"{burst_at.minute} {burst_at.hour} * * *"
    for n in range(config.burst):
        if n < strict:
            rows.append(_schedule_row(n, config.tenants, group="burst strict", cron=daily,
                                      window=0, priority="CRITICAL", next_at=burst_at))
        else:
            rows.append(_schedule_row(n, config.tenants, group="burst windowed", cron=daily,
                                      window=config.window, priority="DEFAULT", next_at=burst_at))
    for n in range(config.steady):
        rows.append(_schedule_row(n, config.tenants, group="steady", cron="* * * * *",
                                  window=60, priority="DEFAULT", next_at=burst_at))
    # Later today: not one of them is due while the run lasts.
    later = range(run_minutes + 2, 24 * 60 - 2)
    for n in range(config.schedules - config.burst - config.steady):
        at = burst_at + datetime.timedelta(minutes=rng.choice(later))
        rows.append(_schedule_row(n, config.tenants, group="later", cron=f"{at.minute} {at.hour} * * *",
                                  window=300, priority="DEFAULT", next_at=at))
    return rows


def _database_now(conninfo: str) -> datetime.datetime:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def build(pg: PostgresInstance, dbname: str, config: BenchConfig) -> tuple[str, datetime.datetime]:
    """A migrated cell database with the tenants and every schedule; returns the burst's T0."""
    pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)).as_string())
    conninfo = pg.dsn_for(dbname)
    migrate(conninfo, cell=CELL)
    run_minutes = int((config.window + config.max_drain) // 60) + 2
    _grant(conninfo, config.lead + run_minutes * 60 + 600)
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(EPOCH),))
        conn.commit()
        for i in range(config.tenants):
            upsert_tenant(conn, TenantSpec(f"tenant-{i:03d}", Plan.ENTERPRISE, max_running_jobs=20))
    # T0: the first top of a minute at least --lead seconds after now, so that the
    # load and the processes' start are done before it.
    now = _database_now(conninfo)
    earliest = now + datetime.timedelta(seconds=config.lead)
    burst_at = earliest.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
    rows = schedule_rows(config, burst_at, run_minutes)
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(EPOCH),))
        with conn.cursor() as cursor, cursor.copy(COPY_SCHEDULES) as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # The schedules and the tenants, as autovacuum would have long before a
        # burst. Not the jobs table: analyzed empty, it would plan the claim
        # for an empty queue, which a cell's is not.
        conn.execute("VACUUM (ANALYZE) schedules, tenants")
    ready = _database_now(conninfo)
    if ready >= burst_at - datetime.timedelta(seconds=2):
        raise SystemExit(f"the load ended at {ready:%H:%M:%S}, too close to the burst at "
                         f"{burst_at:%H:%M:%S}: raise --lead")
    return conninfo, burst_at


def drop(pg: PostgresInstance, dbname: str) -> None:
    pg.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
               .format(sql.Identifier(dbname)).as_string())


# --- the processes: dispatchers in an event loop, workers in threads ------------------

class Dispatchers:
    """``count`` real dispatchers, each with its own pool, in one event loop of their own."""

    def __init__(self, conninfo: str, config: BenchConfig) -> None:
        self._pools = [open_pool(conninfo, epoch=EPOCH, min_size=1, max_size=2,
                                 name=f"dispatcher-{i}") for i in range(config.dispatchers)]
        self._dispatch = DispatcherConfig(batch=config.dispatch_batch)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        await asyncio.gather(*(Dispatcher(pool, self._dispatch, name=f"bench-{i}").run(self._stop)
                               for i, pool in enumerate(self._pools)))

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()
        for pool in self._pools:
            pool.close()


def ours_worker(pool: ConnectionPool, index: int, config: BenchConfig, *,
                stop: threading.Event, tally: Tally) -> None:
    """Worker.run's claim loop with no-op jobs: claim the free slots class by class,
    finish each job at once, claim again at once after a round that claimed, else
    after the worker's poll."""
    worker_config = WorkerConfig(worker_id=f"bench-{index}", epoch=EPOCH, slots=config.slots,
                                 lease_seconds=LEASE_SECONDS)
    try:
        with pool.connection() as conn:
            while not stop.is_set():
                jobs = claim_round(conn, worker_config, Counter())
                for job in jobs:
                    jobqueue.complete(conn, job, cost=0)
                tally.claimed += len(jobs)
                if not jobs:
                    stop.wait(worker_config.poll_seconds)
    except Exception as error:  # reported with the results, not lost in a thread
        tally.error = error


def seed_worker(pool: ConnectionPool, index: int, config: BenchConfig, *,
                stop: threading.Event, tally: Tally) -> None:
    """The same loop around the seed's claim (one job) and completion."""
    poll = WorkerConfig(worker_id=f"bench-{index}", epoch=EPOCH).poll_seconds
    stats = WorkerStats()
    try:
        with pool.connection() as conn:
            while not stop.is_set():
                before = stats.claimed
                seed_round(conn, stats)
                tally.claimed = stats.claimed
                if stats.claimed == before:
                    stop.wait(poll)
    except Exception as error:
        tally.error = error


def run_variant(pg: PostgresInstance, variant: str, config: BenchConfig, index: int) -> Outcome:
    dbname = f"schedules_{index}"
    started = time.monotonic()
    _progress(f"[{variant}] loading {config.tenants} tenants and {config.schedules:,} schedules")
    conninfo, burst_at = build(pg, dbname, config)
    setup_seconds = time.monotonic() - started
    assert pg.process is not None and pg.process.pid is not None
    postmaster = pg.process.pid
    try:
        dispatchers = Dispatchers(conninfo, config)
        pool = open_pool(conninfo, epoch=EPOCH, min_size=config.workers,
                         max_size=config.workers, name=f"bench-{variant}")
        stop = threading.Event()
        tallies = [Tally() for _ in range(config.workers)]
        target = ours_worker if variant == "ours" else seed_worker
        threads = [threading.Thread(target=target, args=(pool, i, config), daemon=True,
                                    kwargs={"stop": stop, "tally": tallies[i]})
                   for i in range(config.workers)]
        dispatchers.start()
        for thread in threads:
            thread.start()
        _progress(f"[{variant}] {config.dispatchers} dispatchers and {config.workers} workers up; "
                  f"burst of {config.burst:,} at {burst_at:%H:%M:%S} UTC")
        pg_cpu, client_cpu, busy = (tree_cpu_seconds(postmaster), self_cpu_seconds(),
                                    machine_busy_seconds())
        measured_from = time.monotonic()
        try:
            watch(conninfo, variant, config, burst_at.timestamp())
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            dispatchers.stop()
            pool.close()
        elapsed = time.monotonic() - measured_from
        pg_cpu = tree_cpu_seconds(postmaster) - pg_cpu
        client_cpu = self_cpu_seconds() - client_cpu
        busy = machine_busy_seconds() - busy
        with psycopg.connect(conninfo, autocommit=True) as conn:
            runs = [Run(*row) for row in conn.execute(RUNS).fetchall()]
            overdue_row = conn.execute(OVERDUE).fetchone()
        assert overdue_row is not None
    finally:
        drop(pg, dbname)
    return Outcome(variant=variant, burst_at=burst_at.timestamp(), runs=runs,
                   overdue=int(overdue_row[0]), claimed=sum(t.claimed for t in tallies),
                   elapsed=elapsed, postgres_cores=pg_cpu / elapsed,
                   client_cores=client_cpu / elapsed,
                   other_cores=max(0.0, busy - pg_cpu - client_cpu) / elapsed,
                   setup_seconds=setup_seconds,
                   errors=[t.error for t in tallies if t.error is not None])


def watch(conninfo: str, variant: str, config: BenchConfig, burst_at: float) -> None:
    """Until the burst's window has passed, plus ``--settle`` seconds, and its jobs
    are all claimed; or ``--max-drain`` seconds after the window at the most."""
    burst_jobs_done_after = burst_at + config.window + config.settle
    give_up_at = burst_at + config.window + config.max_drain
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            row = conn.execute(PROGRESS).fetchone()
            assert row is not None
            runs, queued, done, burst_claimed, now = row
            _progress(f"[{variant}] T0{now - burst_at:+7.1f}s: {runs:,} runs dispatched, "
                      f"{queued:,} jobs queued, {done:,} done, {burst_claimed:,} of the burst's "
                      "claimed")
            if now >= give_up_at or (now >= burst_jobs_done_after
                                     and burst_claimed >= config.burst):
                return
            time.sleep(5.0 if now < burst_at - 5 or now > burst_at + 30 else 1.0)


# --- report -----------------------------------------------------------------------------

def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _busiest(instants: list[float], seconds: int) -> float:
    """The most events in any ``seconds``-long span starting at a whole second, per second."""
    per_second = Counter(int(t) for t in instants)
    if not per_second:
        return 0.0
    first, last = min(per_second), max(per_second)
    return max(sum(per_second[s + k] for k in range(seconds))
               for s in range(first, last + 1)) / seconds


def print_tables(outcomes: list[Outcome], config: BenchConfig, server_version: str) -> None:
    strict = round(config.burst * config.strict_share)
    print(f"\n### {config.schedules:,} active schedules, {config.burst:,} due at the same top of "
          f"a minute ({strict:,} strict, {config.burst - strict:,} with a {config.window} s "
          f"window), {config.steady:,} minutely beside them; {config.dispatchers} dispatchers "
          f"(batch {config.dispatch_batch}), {config.workers} workers x {config.slots} slots, "
          f"no-op jobs; {os.cpu_count()} CPUs\n")
    print("| variant | early dispatches / claims | strict dispatch lag p50 / p99 / max (s) "
          f"| goal p99 <= {STRICT_LAG_GOAL_SECONDS:g} s | strict claim lag p50 / p99 / max (s) "
          "| windowed dispatched in window | windowed claimed in window | strict burst "
          "dispatched/s | dispatches in the busiest second | strict burst claimed/s | burst drained "
          "(s after T0) | overdue at end |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for o in outcomes:
        print(row_of(o, strict))
    print()
    print("| variant | runs | of the burst | steady runs | postgres cores | client cores "
          "| other cores | setup (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for o in outcomes:
        burst = sum(1 for r in o.runs if r.group.startswith("burst"))
        steady = sum(1 for r in o.runs if r.group == "steady")
        print(f"| {o.variant} | {len(o.runs):,} | {burst:,} of {config.burst:,} | {steady:,} "
              f"| {o.postgres_cores:.2f} | {o.client_cores:.2f} | {o.other_cores:.2f} "
              f"| {o.setup_seconds:.0f} |")
    print_anchors(config)
    print_notes(outcomes, config, server_version)


def row_of(o: Outcome, strict_count: int) -> str:
    early_dispatch = sum(1 for r in o.runs if r.dispatched < r.scheduled + r.offset)
    early_claim = sum(1 for r in o.runs
                      if r.started is not None and r.started < r.scheduled + r.offset)
    strict = [r for r in o.runs if r.window == 0]
    lags = [r.dispatched - r.scheduled for r in strict]
    claim_lags = [r.started - r.scheduled for r in strict if r.started is not None]
    unclaimed_strict = sum(1 for r in strict if r.started is None)
    windowed = [r for r in o.runs if r.window > 0]
    in_window = sum(1 for r in windowed if 0 <= r.dispatched - r.scheduled < r.window)
    claimed_in_window = sum(1 for r in windowed if r.started is not None
                            and 0 <= r.started - r.scheduled < r.window)
    burst_strict = [r.dispatched for r in strict if r.group == "burst strict"]
    rate = (len(burst_strict) / max(1e-3, max(burst_strict) - o.burst_at)
            if burst_strict else 0.0)
    burst_started = [r.started for r in o.runs if r.group.startswith("burst")
                     and r.started is not None]
    strict_started = [r.started for r in strict if r.started is not None]
    claim_rate = (len(strict_started) / max(1e-3, max(strict_started) - o.burst_at)
                  if strict_started else 0.0)
    outside = Counter(r.group for r in windowed if not 0 <= r.dispatched - r.scheduled < r.window)
    outside_note = ("; outside: " + ", ".join(f"{n} {g}" for g, n in sorted(outside.items()))
                    if outside else "")
    drained = (f"{max(burst_started) - o.burst_at:.1f}" if burst_started else "n/a")
    p99 = _percentile(lags, 0.99)
    goal = "met" if strict and p99 <= STRICT_LAG_GOAL_SECONDS else "NOT met"
    unclaimed = f" ({unclaimed_strict} unclaimed)" if unclaimed_strict else ""
    return (f"| {o.variant} | {early_dispatch} / {early_claim} "
            f"| {_percentile(lags, 0.5):.3f} / {p99:.3f} / {max(lags, default=float('nan')):.3f} "
            f"| {goal} "
            f"| {_percentile(claim_lags, 0.5):.3f} / {_percentile(claim_lags, 0.99):.3f} / "
            f"{max(claim_lags, default=float('nan')):.3f}{unclaimed} "
            f"| {in_window / len(windowed):.2%} ({in_window:,} of {len(windowed):,}"
            f"{outside_note}) "
            f"| {claimed_in_window / len(windowed):.2%} "
            f"| {rate:,.0f} | {_busiest([r.dispatched for r in o.runs], 1):,.0f} "
            f"| {claim_rate:,.0f} | {drained} | {o.overdue} |")


def print_anchors(config: BenchConfig) -> None:
    print("\n### Anchors: what others promise\n")
    print("| scheduler | precision | burst | after a long outage |")
    print("| --- | --- | --- | --- |")
    print(f"| cellplane (this run) | strict: the table's lag; windowed: inside "
          f"[T, T + window) | {config.burst:,} due in one second, above | `misfire_policy`: "
          "RUN_ONCE (default) one run for all missed, RUN_ALL the latest "
          "`max_catch_up_runs` (<= 1000), SKIP none; never refuses |")
    print("| EventBridge Scheduler | 60 s (minute-level; `FlexibleTimeWindow` up to 1440 min "
          "spreads further) | default quota 1,000 invocations/s, adjustable | its own "
          "retry policy per invocation; a schedule is not replayed |")
    print("| Kubernetes CronJob | the controller checks every 10 s (a "
          "`startingDeadlineSeconds` under 10 s may miss) | one Job object per run through "
          "the API server | counts the missed times since the last run (or in the last "
          "`startingDeadlineSeconds`); more than 100: the docs say it does not start the Job "
          "and logs an error; since the v2 controller it starts the latest only and records "
          "a `TooManyMissedTimes` warning |")


def print_notes(outcomes: list[Outcome], config: BenchConfig, server_version: str) -> None:
    print()
    print(f"- PostgreSQL {server_version} on 127.0.0.1, fsync=off (the local control plane's "
          f"settings); {os.cpu_count()} CPUs shared by the server, this process and anything "
          "else on the machine (other cores).")
    print("- Schedules loaded with one COPY per variant (the setup's fast path, not the API); "
          "`VACUUM (ANALYZE)` of schedules and tenants after, as autovacuum would have done long before a burst (not of the empty jobs table: that would plan the claim for an empty queue).")
    print("- Early: a run dispatched, or its job first claimed, before its scheduled time plus "
          "its offset in the window, both by the database's now() (goal 0). Strict lags are "
          "from the scheduled time: dispatch = the dispatcher transaction's now(), claim = "
          "the job's first claim. Windowed: dispatched (claimed) within [T, T + window).")
    print("- Strict burst dispatched/s (claimed/s): the strict occurrences of the burst over "
          "the time from T0 to the last one's dispatch (its job's first claim); all are due at "
          "T0, so both are rates under a backlog. Busiest second: the most runs dispatched "
          "in one whole second.")
    print("- Workers finish each job as soon as they claim it (no target call), so claims/s is "
          "the queue's claim-and-complete rate under the dispatcher's inserts, not a target's.")
    print("- CRITICAL lag under a LOW flood: `benchmarks/priority_bulkheads.py` "
          "(README: 16 ms p50 / 71 ms p99 with floors); the seed's claim alone against ours "
          "without a burst: `benchmarks/claims.py`.")
    for o in outcomes:
        print(f"- {o.variant}: workers claimed {o.claimed:,} jobs in {o.elapsed:.0f} s "
              f"({o.claimed / o.elapsed:,.0f}/s over the whole run).")
        for error in o.errors[:3]:
            print(f"- {o.variant}: a worker stopped on {type(error).__name__}: {error}")
    print(f"- load average (1, 5, 15 min) at the end: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")


def parse_args() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--schedules", type=int, default=100_000, help="active schedules in all")
    parser.add_argument("--burst", type=int, default=10_000, help="of them due at T0")
    parser.add_argument("--strict-share", type=float, default=0.5,
                        help="share of the burst that is strict (window 0, CRITICAL)")
    parser.add_argument("--window", type=int, default=300,
                        help="the other burst schedules' dispatch window (s)")
    parser.add_argument("--steady", type=int, default=3_000,
                        help="minutely schedules beside the burst (steady/60 runs a second)")
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--dispatch-batch", type=int, default=DispatcherConfig().batch)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--lead", type=float, default=20.0,
                        help="least seconds between the load's end and the burst")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds to go on after the burst's window")
    parser.add_argument("--max-drain", type=float, default=120.0,
                        help="most seconds to go on after the window for the burst's jobs")
    parser.add_argument("--variants", default="ours,seed")
    args = parser.parse_args()
    if args.burst + args.steady > args.schedules:
        parser.error("--burst + --steady must not exceed --schedules")
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if not set(variants) <= {"ours", "seed"}:
        parser.error("--variants: ours, seed")
    return BenchConfig(schedules=args.schedules, burst=args.burst, strict_share=args.strict_share,
                       window=args.window, steady=args.steady, tenants=args.tenants,
                       dispatchers=args.dispatchers, dispatch_batch=args.dispatch_batch,
                       workers=args.workers, slots=args.slots, lead=args.lead,
                       settle=args.settle, max_drain=args.max_drain, variants=variants)


def main() -> None:
    config = parse_args()
    plane = LocalControlPlane(LocalPlaneConfig(regions=(), with_apiserver=False))
    try:
        _progress("starting PostgreSQL 15 on 127.0.0.1 (fsync off)")
        pg = plane.add_postgres("schedules")
        server_version = str(pg.execute("SHOW server_version")[0][0])
        outcomes = [run_variant(pg, variant, config, index)
                    for index, variant in enumerate(config.variants)]
        print_tables(outcomes, config, server_version)
    finally:
        plane.stop()
        plane.remove()


if __name__ == "__main__":
    main()
