"""Helpers for tests of the cell stack against a real Postgres (imported by conftest)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from cellplane_cells.migrate import migrate
from cellplane_operator.localplane import PostgresInstance
from cellplane_operator.localplane.pgauth import new_password, scram_verifier, write_passfile

CELL = "cell-test"


def create_cell_database(pg: PostgresInstance, dbname: str = "cell") -> str:
    """A migrated cell database whose placement group is granted epoch 1 for an hour."""
    pg.execute(f'CREATE DATABASE "{dbname}"')
    conninfo = pg.dsn_for(dbname)
    migrate(conninfo, cell=CELL)
    grant(conninfo, epoch=1, seconds=3600)
    return conninfo


def role_conninfo(pg: PostgresInstance, dbname: str, role: str) -> str:
    """A conninfo of one of the cell's roles (``cellplane_cells.roles``), as a cell process
    gets it: the role is given a new password, kept in a passfile of its own."""
    password = new_password()
    pg.execute(f"ALTER ROLE {role} LOGIN PASSWORD '{scram_verifier(password)}'")
    passfile = write_passfile(pg.passfile.with_name(f"{pg.passfile.stem}.{role}.pgpass"),
                              {role: password})
    return pg.dsn_for(dbname, user=role, passfile=passfile)


def grant(conninfo: str, *, epoch: int, seconds: float) -> None:
    """What the lease owner's renewal does: epoch and remaining time, as a duration."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT cellplane_grant(%s, make_interval(secs => %s))", (epoch, seconds))


def enqueue(conn: psycopg.Connection[Any], tenant_id: str, count: int, *, steps: int = 1,
            estimate: int = 0, target: str = "default", priority: str = "DEFAULT",
            ) -> list[uuid.UUID]:
    """Queues jobs directly (no API, no reservation), for queue-only tests."""
    ids = [uuid.uuid4() for _ in range(count)]
    with conn.transaction(), conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload,"
            " max_attempts, estimate, priority, created_at)"
            " VALUES (%s, %s, 'queued', %s, %s, %s, 5, %s, %s, clock_timestamp())",
            [(job_id, tenant_id, target, steps, Jsonb({"n": i}), estimate, priority)
             for i, job_id in enumerate(ids)],
        )
        cursor.executemany(
            "INSERT INTO job_steps (job_id, step, idempotency_key, status)"
            " SELECT %s, n, %s || '/' || n, 'pending' FROM generate_series(1, %s) n",
            [(job_id, str(job_id), steps) for job_id in ids],
        )
    return ids


def setup_tenant(conninfo: str, tenant_id: str, *, target_url: str, plan: str = "pro",
                 credit: int = 1_000_000, max_running_jobs: int | None = None) -> str:
    """A tenant with a wallet credit and its `default` target; returns its signing secret."""
    from cellplane_cells.domain.plans import Plan
    from cellplane_cells.tenants import TenantSpec, credit_wallet, register_target, upsert_tenant

    with psycopg.connect(conninfo) as conn:
        conn.execute("SET cellplane.epoch = '1'")
        conn.commit()
        upsert_tenant(conn, TenantSpec(tenant_id, Plan(plan), max_running_jobs=max_running_jobs))
        if credit:
            credit_wallet(conn, tenant_id, credit)
        register_target(conn, tenant_id, "default", target_url, allow_private=True)
        row = conn.execute("SELECT signing_secret FROM tenants WHERE tenant_id = %s",
                           (tenant_id,)).fetchone()
        assert row is not None
        return str(row[0])


def fetch(conninfo: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return list(conn.execute(sql.encode(), params).fetchall())


def write(conninfo: str, sql: str, *params: Any, epoch: int = 1) -> None:
    """A write as the placement group's owner would make it (fault injection in tests)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT set_config('cellplane.epoch', %s, false)", (str(epoch),))
        conn.execute(sql.encode(), params)
