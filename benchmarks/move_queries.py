"""The cell's move queries on their own: the checksums of the pause and the scope's pages.

    .venv/bin/python benchmarks/move_queries.py [--sizes 10000,100000] [--runs 5] [--limit 2000]
                                                 [--other-jobs 0]

Starts its own PostgreSQL 15 on loopback through the local control plane launcher
(fsync off, as the plane runs it), migrates one cell database and grants its epoch.
For each size, one tenant holds that many queued jobs, written as benchmarks/moves.py
seeds them (two pending steps, an idempotency key and a reservation in the ledger
each), plus an outbox event for every tenth job; ``--other-jobs`` adds another
tenant with that many finished jobs (steps, two ledger rows, a key each), so that
a plan that reads whole tables shows it. Then ANALYZE, as autovacuum would have.

Measured, in this process, through the functions the admin routes call
(``moves.checksums`` and ``moves.scope_page``, no HTTP):
- checksums: ``--runs`` calls, their p50 and max;
- paging: every page of the jobs, steps and ledger tables at ``--limit`` rows,
  rows per second over the whole table (the first page included).
A benchmark, not a test: it prints a markdown table and judges nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from cellplane_cells import moves
from cellplane_cells.migrate import migrate
from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.controlplane import LocalPlaneConfig

CELL = "bench-cell"
TENANT = "acme"
OTHER = "other"
PAGED = ("jobs", "steps", "ledger")

GRANT = "SELECT cellplane_grant(1, make_interval(secs => 36000))"
TENANT_ROWS = """
INSERT INTO tenants (tenant_id, plan, max_running_jobs, jobs_per_second, burst, daily_spend_limit,
                     signing_secret)
VALUES (%(tenant)s, 'enterprise', 100, 1000, 1000, 1000000000, 'bench-secret');
INSERT INTO wallets (tenant_id, available, reserved) VALUES (%(tenant)s, 1000000, 0);
INSERT INTO targets (tenant_id, name, url) VALUES (%(tenant)s, 'default', 'http://127.0.0.1:9/');
"""
SEED = """
WITH made AS (
    INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                      estimate, run_after, finished_at)
    SELECT gen_random_uuid(), %(tenant)s, %(status)s, 'default', 2, %(payload)s, 3, 0,
           now() + interval '1 hour', CASE WHEN %(status)s = 'queued' THEN NULL ELSE now() END
      FROM generate_series(1, %(n)s)
    RETURNING job_id
), steps AS (
    INSERT INTO job_steps (job_id, step, idempotency_key, status)
    SELECT job_id, n, job_id || '/' || n, 'pending' FROM made, generate_series(1, 2) n
), keys AS (
    INSERT INTO idempotency_keys (tenant_id, key, request_hash, job_id, status_code, response)
    SELECT %(tenant)s, 'seed-' || job_id, '\\x00', job_id, 202, json_build_object('job_id', job_id)
      FROM made
), events AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), %(tenant)s, job_id, 'job.accepted', json_build_object('job_id', job_id)
      FROM made WHERE random() < 0.1
)
INSERT INTO ledger (tenant_id, job_id, kind, amount)
SELECT %(tenant)s, job_id, k, 0 FROM made,
       unnest(CASE WHEN %(status)s = 'queued' THEN ARRAY['reserve'] ELSE ARRAY['reserve', 'settle'] END) k
"""


def seed(conninfo: str, tenant: str, count: int, status: str) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute(b"SET cellplane.epoch = '1'")
        for start in range(0, count, 20_000):
            conn.execute(SEED.encode(), {"tenant": tenant, "status": status,
                                         "payload": Jsonb({"seeded": True, "n": start}),
                                         "n": min(20_000, count - start)})
            conn.commit()


def fresh_database(pg: Any, name: str, size: int, other_jobs: int) -> str:
    pg.execute(f'CREATE DATABASE "{name}"')
    conninfo: str = pg.dsn_for(name)
    migrate(conninfo, cell=CELL)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(GRANT.encode())
        conn.execute(b"SET cellplane.epoch = '1'")
        for tenant in (TENANT, OTHER):
            for statement in TENANT_ROWS.strip().split(";\n"):
                conn.execute(statement.encode(), {"tenant": tenant})
    seed(conninfo, TENANT, size, "queued")
    if other_jobs:
        seed(conninfo, OTHER, other_jobs, "succeeded")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(b"ANALYZE")
    return conninfo


def time_checksums(conninfo: str, runs: int) -> tuple[list[float], dict[str, dict[str, Any]]]:
    took: list[float] = []
    result: dict[str, dict[str, Any]] = {}
    with psycopg.connect(conninfo) as conn:
        moves.checksums(conn, TENANT)  # warm the cache, as the operator's rehearsal does
        for _ in range(runs):
            started = time.perf_counter()
            result = moves.checksums(conn, TENANT)
            took.append(time.perf_counter() - started)
    return took, result


def page_rate(conninfo: str, table: str, limit: int) -> tuple[int, int, float]:
    """Rows, pages, seconds for the whole table."""
    rows = pages = 0
    after: str | None = None
    with psycopg.connect(conninfo) as conn:
        started = time.perf_counter()
        while True:
            found, after = moves.scope_page(conn, TENANT, table, after=after, limit=limit)
            rows += len(found)
            pages += 1
            if after is None:
                break
        return rows, pages, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit", type=int, default=2000, help="rows per page (the operator's)")
    parser.add_argument("--other-jobs", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    plane = LocalControlPlane(LocalPlaneConfig(regions=(), with_apiserver=False))
    lines: list[str] = []
    try:
        pg = plane.add_postgres("bench")
        for size in sizes:
            print(f"seeding {size} jobs (+{args.other_jobs} of another tenant)", file=sys.stderr)
            conninfo = fresh_database(pg, f"moves_{size}", size, args.other_jobs)
            took, sums = time_checksums(conninfo, args.runs)
            rates = []
            for table in PAGED:
                rows, pages, seconds = page_rate(conninfo, table, args.limit)
                expected = sums[table]["rows"]
                mark = "" if rows == expected else f" (!= {expected})"
                rates.append(f"{rows / seconds:,.0f} ({rows}{mark} in {pages} pages)")
            lines.append(f"| {size} | {statistics.median(took):.3f} | {max(took):.3f} | "
                         + " | ".join(rates) + " |")
            pg.execute(f'DROP DATABASE "moves_{size}"')
    finally:
        plane.stop()
        plane.remove()
    print(f"\nOther tenant's finished jobs: {args.other_jobs}; page limit {args.limit}; "
          f"checksums {args.runs} runs after one warm-up.\n")
    print("| jobs | checksums p50 s | max s | jobs rows/s | steps rows/s | ledger rows/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
