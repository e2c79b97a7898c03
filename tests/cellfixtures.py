"""Helpers for tests of the cell stack against a real Postgres (imported by conftest)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from cellplane_cells.migrate import migrate
from cellplane_operator.localplane import PostgresInstance

CELL = "cell-test"


def create_cell_database(pg: PostgresInstance, dbname: str = "cell") -> str:
    """A migrated cell database whose placement group is granted epoch 1 for an hour."""
    pg.execute(f'CREATE DATABASE "{dbname}"')
    conninfo = pg.dsn_for(dbname)
    migrate(conninfo, cell=CELL)
    grant(conninfo, epoch=1, seconds=3600)
    return conninfo


def grant(conninfo: str, *, epoch: int, seconds: float) -> None:
    """What the lease owner's renewal does: epoch and remaining time, as a duration."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(%s, make_interval(secs => %s))", (epoch, seconds))


def enqueue(conn: psycopg.Connection[Any], tenant_id: str, count: int, *, steps: int = 1,
            estimate: int = 0, target: str = "default") -> list[uuid.UUID]:
    """Queues jobs directly (no API, no reservation), for queue-only tests."""
    ids = [uuid.uuid4() for _ in range(count)]
    with conn.transaction(), conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,"
            " max_attempts, estimate, created_at)"
            " VALUES (%s, %s, 'queued', %s, %s, %s, 5, %s, clock_timestamp())",
            [(job_id, tenant_id, target, steps, Jsonb({"n": i}), estimate)
             for i, job_id in enumerate(ids)],
        )
        cursor.executemany(
            "INSERT INTO job_steps (job_id, step, idempotency_key, status)"
            " SELECT %s, n, %s || '/' || n, 'pending' FROM generate_series(1, %s) n",
            [(job_id, str(job_id), steps) for job_id in ids],
        )
    return ids
