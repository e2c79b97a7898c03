"""CRITICAL dispatch lag under a LOW flood: no bulkheads, priority classes, classes with floors.

    .venv/bin/python benchmarks/priority_bulkheads.py [--seconds 30] [--workers 4] [--slots 10]

Starts its own PostgreSQL 15 on loopback (fsync off, as the local control plane
runs it) and builds one cell database with 20 enterprise tenants and 2,000
queued LOW jobs each (the flood: more than the run can drain), copied per
variant so each starts from the same rows. Each variant runs ``--workers``
simulated workers of ``--slots`` slots: threads that claim with the real claim
round (``cellplane_cells.worker.claim_round``: the classes with work, then
claim by class as ``domain/priorities.py`` decides) and complete with the real
``complete_job``, and that loop as ``Worker.run`` does: claim again at once
after a round that claimed or when a job ends, otherwise after
``--poll-seconds`` (``--poll-only``: not when a job ends, as workers did
before priority classes). A job "runs"
for a random time around ``--low-seconds`` (LOW) or ``--critical-seconds``,
without calling anything. Meanwhile a producer queues one CRITICAL job every
``--probe-interval`` seconds for a random tenant.

A probe's dispatch lag is the claim's ``now()`` minus the job's ``run_after``
(its insert's ``now()``): the database's clock on both ends. Variants:

* ``no bulkheads``: every job in one class (today's claim: each tenant's
  oldest due job, tenants in turn); the probes are DEFAULT jobs like the flood;
* ``classes, no floors``: the probes are CRITICAL, the flood LOW, floors 0;
* ``classes + floors``: the same with the default floors (2, 2, 2, 1 of 10).

A second scenario adds a HIGH flood beside the LOW one and reports LOW's share
of the claims, which is what the floors are for: without them a class below a
busy one gets nothing. A benchmark, not a test: it prints markdown tables and
judges nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cellplane_cells import jobqueue
from cellplane_cells.db import open_pool
from cellplane_cells.domain.plans import Plan
from cellplane_cells.domain.priorities import Floors, Priority
from cellplane_cells.migrate import migrate
from cellplane_cells.tenants import TenantSpec, upsert_tenant
from cellplane_cells.worker import WorkerConfig, claim_round
from cellplane_operator.localplane import LocalControlPlane, PostgresInstance
from cellplane_operator.localplane.controlplane import LocalPlaneConfig

CELL = "cell-bench"
EPOCH = 1
TEMPLATE_DB = "bulkheads_template"
LEASE_SECONDS = 300.0

GRANT_EPOCH = "SELECT cellplane_grant(%(epoch)s, make_interval(secs => %(seconds)s))"

# Jobs n = 0..jobs-1 of one class go to tenant n mod tenants, queued an hour
# ago, interleaved in time. Set-based: one statement, not rows through the client.
BULK_LOAD = """
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                  estimate, priority, created_at, run_after)
SELECT gen_random_uuid(), t.ids[1 + mod(n, cardinality(t.ids))], 'queued', 'default', 1,
       jsonb_build_object('n', n), 5, 0, %(priority)s,
       now() - interval '1 hour' + make_interval(secs => n / 1e6),
       now() - interval '1 hour'
  FROM generate_series(0, %(jobs)s - 1) AS n,
       (SELECT array_agg(tenant_id ORDER BY tenant_id) AS ids FROM tenants) AS t
"""

# Every job of the template in one class: the "no bulkheads" reference.
ONE_CLASS = "UPDATE jobs SET priority = 'DEFAULT'"

INSERT_PROBE = """
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                  estimate, priority)
VALUES (gen_random_uuid(), %(tenant_id)s, 'queued', 'default', 1, %(payload)s, 5, 0,
        %(priority)s)
"""

UNCLAIMED_PROBE_AGES = """
SELECT extract(epoch FROM now() - run_after)::float8 FROM jobs
 WHERE status = 'queued' AND payload ? 'probe'
"""


@dataclass(frozen=True)
class BenchConfig:
    seconds: float
    workers: int
    slots: int
    tenants: int
    low_jobs: int
    high_jobs: int
    low_seconds: float
    critical_seconds: float
    probe_interval: float
    poll_seconds: float
    wake_on_free: bool


@dataclass(frozen=True)
class Variant:
    name: str
    classes: bool
    """False: every job (probes too) is DEFAULT, as before priority classes."""
    floors: bool
    high_flood: bool = False


@dataclass
class Tally:
    lags: list[float] = field(default_factory=list)
    claimed: Counter[Priority] = field(default_factory=Counter)
    rounds: int = 0
    error: Exception | None = None


@dataclass(frozen=True)
class Outcome:
    variant: Variant
    probes_sent: int
    lags: list[float]
    """Claimed probes' lags, then the unclaimed ones' ages at the end (lower bounds)."""
    unclaimed: int
    claimed: Counter[Priority]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _grant(conninfo: str, seconds: float) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(GRANT_EPOCH, {"epoch": EPOCH, "seconds": seconds})


def build_template(pg: PostgresInstance, config: BenchConfig) -> None:
    pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)).as_string())
    conninfo = pg.dsn_for(TEMPLATE_DB)
    migrate(conninfo, cell=CELL)
    _grant(conninfo, 3600)
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(EPOCH),))
        conn.commit()
        for i in range(config.tenants):
            # The probes are CRITICAL: only tenants with a strict allowance may queue such work.
            upsert_tenant(conn, TenantSpec(f"tenant-{i:03d}", Plan.ENTERPRISE, max_running_jobs=20,
                                           strict_schedules=1))
        with conn.transaction():
            conn.execute(BULK_LOAD, {"jobs": config.low_jobs, "priority": "LOW"})
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE, FREEZE)")


def prepare(pg: PostgresInstance, dbname: str, variant: Variant, config: BenchConfig) -> str:
    pg.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY")
               .format(sql.Identifier(dbname), sql.Identifier(TEMPLATE_DB)).as_string())
    conninfo = pg.dsn_for(dbname)
    _grant(conninfo, config.seconds + 600)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(EPOCH),))
        if variant.high_flood:
            conn.execute(BULK_LOAD, {"jobs": config.high_jobs, "priority": "HIGH"})
        if not variant.classes:
            conn.execute(ONE_CLASS)
        conn.execute("ANALYZE jobs")
    return conninfo


def _duration(job: jobqueue.ClaimedJob, config: BenchConfig, rng: random.Random) -> float:
    mean = config.critical_seconds if "probe" in job.payload else config.low_seconds
    return rng.uniform(0.5 * mean, 1.5 * mean)


def worker(pool: Any, index: int, config: BenchConfig, floors: Floors, *, stop_at: float,
           tally: Tally) -> None:
    """Worker.run's loop over simulated jobs: claim at once after a round that claimed
    or when a job ends, else after the poll; a job's slot frees when its time is up."""
    rng = random.Random(index)
    worker_config = WorkerConfig(worker_id=f"bench-{index}", epoch=EPOCH, slots=config.slots,
                                 lease_seconds=LEASE_SECONDS, floors=floors)
    running: list[tuple[float, jobqueue.ClaimedJob]] = []
    next_claim_at = time.monotonic()
    try:
        with pool.connection() as conn:
            while (now := time.monotonic()) < stop_at:
                for item in [r for r in running if r[0] <= now]:
                    jobqueue.complete(conn, item[1], cost=0)
                    running.remove(item)
                    if config.wake_on_free:
                        next_claim_at = now
                if now >= next_claim_at:
                    jobs = (claim_round(conn, worker_config,
                                        Counter(job.priority for _, job in running))
                            if len(running) < config.slots else [])
                    tally.rounds += 1
                    for job in jobs:
                        tally.claimed[job.priority] += 1
                        if "probe" in job.payload:
                            tally.lags.append(job.waited_seconds)
                        running.append((time.monotonic() + _duration(job, config, rng), job))
                    next_claim_at = now if jobs else now + config.poll_seconds
                wake = min([next_claim_at, stop_at, *(r[0] for r in running)])
                time.sleep(max(0.0, wake - time.monotonic()))
    except Exception as error:  # reported with the results, not lost in a thread
        tally.error = error


def producer(conninfo: str, variant: Variant, config: BenchConfig, *, stop_at: float,
             sent: list[int]) -> None:
    rng = random.Random(7)
    priority = "CRITICAL" if variant.classes else "DEFAULT"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(EPOCH),))
        next_at = time.monotonic() + 1.0  # once the flood has taken every slot
        while next_at < stop_at - config.probe_interval:
            time.sleep(max(0.0, next_at - time.monotonic()))
            conn.execute(INSERT_PROBE, {"tenant_id": f"tenant-{rng.randrange(config.tenants):03d}",
                                        "payload": Jsonb({"probe": True}), "priority": priority})
            sent[0] += 1
            next_at += config.probe_interval


def run_variant(pg: PostgresInstance, variant: Variant, config: BenchConfig,
                index: int) -> Outcome:
    dbname = f"bulkheads_{index}"
    conninfo = prepare(pg, dbname, variant, config)
    floors = Floors.default_for(config.slots) if variant.floors else Floors.none(config.slots)
    try:
        pool = open_pool(conninfo, epoch=EPOCH, min_size=config.workers,
                         max_size=config.workers, name=f"bench-{index}")
        try:
            tallies = [Tally() for _ in range(config.workers)]
            sent = [0]
            start_at = time.monotonic()
            stop_at = start_at + config.seconds
            threads = [threading.Thread(target=worker, args=(pool, i, config, floors),
                                        kwargs={"stop_at": stop_at, "tally": tallies[i]},
                                        daemon=True) for i in range(config.workers)]
            threads.append(threading.Thread(target=producer, args=(conninfo, variant, config),
                                            kwargs={"stop_at": stop_at, "sent": sent},
                                            daemon=True))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            pool.close()
        for tally in tallies:
            if tally.error is not None:
                raise tally.error
        with psycopg.connect(conninfo, autocommit=True) as conn:
            unclaimed = [row[0] for row in conn.execute(UNCLAIMED_PROBE_AGES).fetchall()]
    finally:
        pg.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                   .format(sql.Identifier(dbname)).as_string())
    claimed: Counter[Priority] = Counter()
    for tally in tallies:
        claimed.update(tally.claimed)
    lags = [lag for tally in tallies for lag in tally.lags]
    return Outcome(variant, sent[0], lags + unclaimed, len(unclaimed), claimed)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _seconds(value: float, lower_bound: bool) -> str:
    return f"{'>= ' if lower_bound else ''}{value:.3f}"


def print_tables(outcomes: list[Outcome], config: BenchConfig) -> None:
    slots = config.workers * config.slots
    print(f"\n### CRITICAL dispatch lag under a LOW flood ({config.tenants} tenants, "
          f"{config.low_jobs:,} LOW jobs queued; {config.workers} workers x {config.slots} "
          f"slots = {slots}; LOW jobs ~{config.low_seconds:g} s; one probe every "
          f"{config.probe_interval:g} s; poll {config.poll_seconds:g} s"
          f"{'' if config.wake_on_free else ', no wake when a job ends'}; {config.seconds:g} s "
          "per variant)\n")
    print("| variant | floors | probes | claimed | lag p50 (s) | lag p99 (s) | lag max (s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for o in outcomes:
        if o.variant.high_flood:
            continue
        ordered = sorted(o.lags)
        # An unclaimed probe's age is only a lower bound of its lag: so is any
        # percentile that reaches into them.
        bound = len(ordered) - o.unclaimed
        cells = []
        for q in (0.50, 0.99, 1.0):
            position = min(len(ordered) - 1, int(q * len(ordered)))
            cells.append(_seconds(_percentile(ordered, q), position >= bound and o.unclaimed > 0))
        floors = "2/2/2/1" if o.variant.floors else ("0" if o.variant.classes else "n/a")
        print(f"| {o.variant.name} | {floors} | {o.probes_sent} | {o.probes_sent - o.unclaimed} "
              f"| {' | '.join(cells)} |")
    print("\n### What the floors are for: LOW's share under a HIGH flood beside the LOW one\n")
    print("| variant | CRITICAL lag p99 (s) | HIGH claimed | LOW claimed | LOW share |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for o in outcomes:
        if not o.variant.high_flood:
            continue
        high, low = o.claimed[Priority.HIGH], o.claimed[Priority.LOW]
        share = low / (high + low) if high + low else 0.0
        print(f"| {o.variant.name} | {_percentile(o.lags, 0.99):.3f} | {high} | {low} "
              f"| {share:.1%} |")
    # Jobs claimed per second against what the slots could run: well below 1 means the
    # machine (shared, or too small) was the bottleneck, and the lags measure it too.
    for o in outcomes:
        rate = sum(o.claimed.values()) / config.seconds
        print(f"\n- {o.variant.name}: {rate:.0f} jobs claimed/s, "
              f"{rate * config.low_seconds / slots:.0%} of what {slots} slots run", end="")
    print(f"\n- load average (1, 5, 15 min) at the end: "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


def parse_args() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--low-jobs", type=int, default=40_000)
    parser.add_argument("--high-jobs", type=int, default=40_000)
    parser.add_argument("--low-seconds", type=float, default=0.5)
    parser.add_argument("--critical-seconds", type=float, default=0.1)
    parser.add_argument("--probe-interval", type=float, default=0.25)
    parser.add_argument("--poll-seconds", type=float, default=0.5,
                        help="the worker's pause after a round that claimed nothing "
                             "(WorkerConfig.poll_seconds)")
    parser.add_argument("--poll-only", action="store_true",
                        help="a freed slot waits for the poll (workers before priority classes)")
    args = parser.parse_args()
    return BenchConfig(seconds=args.seconds, workers=args.workers, slots=args.slots,
                       tenants=args.tenants, low_jobs=args.low_jobs, high_jobs=args.high_jobs,
                       low_seconds=args.low_seconds, critical_seconds=args.critical_seconds,
                       probe_interval=args.probe_interval, poll_seconds=args.poll_seconds,
                       wake_on_free=not args.poll_only)


def main() -> None:
    config = parse_args()
    variants = [
        Variant("no bulkheads", classes=False, floors=False),
        Variant("classes, no floors", classes=True, floors=False),
        Variant("classes + floors", classes=True, floors=True),
        Variant("HIGH + LOW flood, no floors", classes=True, floors=False, high_flood=True),
        Variant("HIGH + LOW flood, floors", classes=True, floors=True, high_flood=True),
    ]
    plane = LocalControlPlane(LocalPlaneConfig(regions=(), with_apiserver=False))
    try:
        _progress("starting PostgreSQL 15 on 127.0.0.1 (fsync off)")
        pg = plane.add_postgres("bulkheads")
        _progress(f"loading {config.tenants} tenants and {config.low_jobs:,} LOW jobs")
        build_template(pg, config)
        outcomes = []
        for index, variant in enumerate(variants):
            _progress(f"running {variant.name} for {config.seconds:g}s")
            outcomes.append(run_variant(pg, variant, config, index))
        print_tables(outcomes, config)
    finally:
        plane.stop()
        plane.remove()


if __name__ == "__main__":
    main()
