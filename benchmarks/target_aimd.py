"""A target with a hidden capacity, called by a cell's worker with and without AIMD.

    .venv/bin/python benchmarks/target_aimd.py [--seconds 20] [--capacity 4] [--slots 32]

Starts its own PostgreSQL 15 on loopback (the local control plane launcher), a
cell database with one enterprise tenant (``--tenants``) whose ``default``
target is an HTTP server on 127.0.0.1 with a hidden capacity: it serves up to
``--capacity`` calls at once, each taking ``--service-ms`` (400), and answers
503 at once to any call beyond that (what an overloaded service behind a load
shedder does). With several tenants, each registers the same service, so it
has one limit per tenant; the table adds them up.

Two variants, each on a fresh database with the same queue (``--jobs`` jobs,
each with attempts enough never to go dead), run one real ``Worker`` with
``--slots`` slots for ``--seconds``:

* ``AIMD, busy wait W s``: the cell's target limits (``domain/aimd.py``)
  with the default increase and decrease, starting at 10 and capped at the
  worker's slots; a job turned away by a full limit waits about W s
  (``--busy-waits``, default the policy's 1 s);
* ``no AIMD (reference)``: the limit pinned at the worker's slots (floor =
  initial = ceiling), which is what a cell without target limits does: every
  free slot calls the target.

Circuit breakers are off in both (a threshold never reached), so what differs
is the limit alone. Retries back off with full jitter from 50 ms (cap 1 s);
the worker polls every 20 ms when a claim gave it nothing to run (the
default is 500 ms), which is also how often it claims while every job it
claims is turned away. Calls are long (400 ms) so that the worker, about
fifteen statements per one-step job, can put more calls in flight than the
target takes; deferrals/s counts jobs claimed and sent back unrun.
A sampler reads the shared limit from the database four times a second. A
benchmark, not a test: it prints a markdown table and judges nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import uvicorn
from psycopg import sql
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cellplane_cells.db import open_pool
from cellplane_cells.domain.aimd import AimdPolicy
from cellplane_cells.domain.breaker import BreakerPolicy
from cellplane_cells.domain.plans import Plan
from cellplane_cells.domain.retry import RetryPolicy
from cellplane_cells.metrics import TARGET_DEFERRALS
from cellplane_cells.migrate import migrate
from cellplane_cells.tenants import TenantSpec, register_target, upsert_tenant
from cellplane_cells.worker import Worker, WorkerConfig
from cellplane_operator.localplane import LocalControlPlane, PostgresInstance
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import wait_for

CELL = "cell-bench"
EPOCH = 1
TENANT = "bench"

BULK_LOAD_JOBS = """
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                  estimate, created_at)
SELECT gen_random_uuid(), t.ids[1 + mod(n, cardinality(t.ids))], 'queued', 'default', 1,
       jsonb_build_object('n', n), 1000, 0,
       now() - interval '1 hour' + make_interval(secs => n / 1e6)
  FROM generate_series(0, %(jobs)s - 1) AS n,
       (SELECT array_agg(tenant_id ORDER BY tenant_id) AS ids FROM tenants) AS t
"""
# The tenants' limits on the one service, added up: what the service is offered at once.
SUM_OF_LIMITS = "SELECT sum(floor(concurrency_limit)) FROM target_limits"

BULK_LOAD_STEPS = """
INSERT INTO job_steps (job_id, step, idempotency_key, status)
SELECT job_id, 1, job_id::text || '/1', 'pending' FROM jobs
"""


@dataclass
class HiddenCapacity:
    """The target: ``capacity`` calls at once, each ``service_seconds`` long; 503 beyond."""
    capacity: int
    service_seconds: float
    port: int = field(default_factory=free_port)
    accepted: int = 0
    refused: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    """Calls at once the worker sent (the refused ones included)."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

        async def handle(request: Request) -> Response:
            await request.body()
            with self._lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                over = self.in_flight > self.capacity
            try:
                if over:
                    with self._lock:
                        self.refused += 1
                    return JSONResponse({"overloaded": True}, status_code=503)
                await asyncio.sleep(self.service_seconds)
                with self._lock:
                    self.accepted += 1
                return JSONResponse({"ok": True})
            finally:
                with self._lock:
                    self.in_flight -= 1

        app = Starlette(routes=[Route("/{path:path}", handle, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=self.port,
                                                     log_level="warning", lifespan="off",
                                                     access_log=False,
                                                     timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        wait_for(lambda: self._server.started, timeout=10, what="the target")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.accepted, self.refused


@dataclass(frozen=True)
class Variant:
    name: str
    policy: AimdPolicy


@dataclass(frozen=True)
class Result:
    name: str
    seconds: float
    accepted: int
    refused: int
    most_in_flight: int
    limits: list[float]
    final_limit: float
    deferrals: int


def _progress(message: str) -> None:
    print(f"[target_aimd] {message}", file=sys.stderr, flush=True)


def fresh_database(pg: PostgresInstance, dbname: str, *, tenants: int, jobs: int,
                   target_url: str) -> str:
    pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)).as_string())
    conninfo = pg.dsn_for(dbname)
    migrate(conninfo, cell=CELL)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(%s, make_interval(secs => 3600))", (EPOCH,))
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(EPOCH),))
        conn.commit()
        for i in range(tenants):
            upsert_tenant(conn, TenantSpec(f"{TENANT}-{i}", Plan.ENTERPRISE, max_running_jobs=500))
            register_target(conn, f"{TENANT}-{i}", "default", target_url, allow_private=True)
        with conn.transaction():
            conn.execute(BULK_LOAD_JOBS, {"jobs": jobs})
            conn.execute(BULK_LOAD_STEPS)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return conninfo


async def run_variant(conninfo: str, variant: Variant, target: HiddenCapacity, *,
                      seconds: float, slots: int) -> Result:
    config = WorkerConfig(f"bench-{variant.name}", epoch=EPOCH, slots=slots, batch=4,
                          poll_seconds=0.02, lease_seconds=60.0, heartbeat_seconds=20.0,
                          call_timeout_seconds=10.0,
                          retry=RetryPolicy(base_seconds=0.05, cap_seconds=1.0),
                          target_limits=variant.policy,
                          target_breaker=BreakerPolicy(failure_threshold=10**9))
    limits: list[float] = []
    stop = asyncio.Event()
    with open_pool(conninfo, epoch=EPOCH, max_size=slots + 3) as pool, \
            psycopg.connect(conninfo, autocommit=True) as sampler:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=slots * 2)) as http:
            worker = Worker(pool, http, config)
            base_accepted, base_refused = target.counts()
            base_deferrals = _deferrals()
            target.most_in_flight = 0
            started = time.monotonic()
            task = asyncio.create_task(worker.run(stop))
            while time.monotonic() - started < seconds:
                await asyncio.sleep(0.25)
                row = sampler.execute(SUM_OF_LIMITS).fetchone()
                if row is not None and row[0] is not None:
                    limits.append(float(row[0]))
            accepted, refused = target.counts()
            deferred = _deferrals() - base_deferrals
            elapsed = time.monotonic() - started
            stop.set()
            await task
        row = sampler.execute(SUM_OF_LIMITS).fetchone()
    return Result(variant.name, elapsed, accepted - base_accepted, refused - base_refused,
                  target.most_in_flight, limits, float(row[0]) if row else float("nan"),
                  deferred)


def _deferrals() -> int:
    """Jobs sent back without an attempt, all reasons (this process's counter)."""
    return int(sum(TARGET_DEFERRALS.labels(reason)._value.get()
                   for reason in ("held", "open", "limit")))


def print_table(results: list[Result], args: argparse.Namespace) -> None:
    print(f"Target with a hidden capacity of {args.capacity} calls at once "
          f"({args.service_ms:g} ms each; 503 beyond), one worker with {args.slots} slots, "
          f"{args.seconds:g} s per variant."
          + (f" {args.tenants} tenants register the same service as their target `default`, "
             "so it has one limit per tenant, shown added up." if args.tenants > 1 else "")
          + "\n")
    print("| variant | calls accepted/s | 503s | 503s per accepted call | most calls at once "
          "| limits at the end (sum) | limits, mean over the last half (sum) | deferrals/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        tail = r.limits[len(r.limits) // 2:] or [float("nan")]
        print(f"| {r.name} | {r.accepted / r.seconds:,.0f} | {r.refused:,} "
              f"| {r.refused / max(r.accepted, 1):.2f} | {r.most_in_flight} "
              f"| {r.final_limit:.1f} | {statistics.fmean(tail):.1f} "
              f"| {r.deferrals / r.seconds:,.0f} |")
    ideal = args.capacity / (args.service_ms / 1000)
    print(f"\nThe target's own ceiling is {ideal:,.0f} calls/s ({args.capacity} at once, "
          f"{args.service_ms:g} ms each).")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=400.0)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--busy-waits", default=f"{AimdPolicy().busy_wait_seconds:g}",
                        type=lambda text: [float(w) for w in text.split(",") if w.strip()],
                        help="how long a job turned away by a full limit waits, one AIMD "
                             "variant each, comma-separated (default: the policy's)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    slots = float(args.slots)
    variants = [
        Variant(f"AIMD, busy wait {wait:g} s", AimdPolicy(initial=min(10.0, slots),
                                                         ceiling=slots, busy_wait_seconds=wait))
        for wait in args.busy_waits
    ] + [
        Variant("no AIMD (reference)", AimdPolicy(initial=slots, floor=slots, ceiling=slots,
                                                  busy_wait_seconds=0.2)),
    ]
    plane = LocalControlPlane(LocalPlaneConfig(regions=(), with_apiserver=False))
    target = HiddenCapacity(args.capacity, args.service_ms / 1000)
    try:
        _progress("starting PostgreSQL 15 on 127.0.0.1 and the target")
        pg = plane.add_postgres("aimd")
        target.start()
        results = []
        for index, variant in enumerate(variants):
            conninfo = fresh_database(pg, f"aimd_{index}", tenants=args.tenants, jobs=args.jobs,
                                      target_url=f"http://{LOOPBACK}:{target.port}/run")
            _progress(f"running {variant.name} for {args.seconds:g}s")
            results.append(asyncio.run(run_variant(conninfo, variant, target,
                                                   seconds=args.seconds, slots=args.slots)))
        print_table(results, args)
    finally:
        target.stop()
        plane.stop()
        plane.remove()


if __name__ == "__main__":
    main()
