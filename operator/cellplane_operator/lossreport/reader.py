"""Reads what a reconciliation report compares: both sites' rows and their WAL positions.

Every function blocks (psycopg, synchronous); the operator calls them through
``asyncio.to_thread``. Connections are made as the sites' superuser, which
``pg_read_file`` of the timeline history needs.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from cellplane_operator.domain.reconciliation import (
    IdempotencyKeyRow,
    JobRow,
    LedgerRow,
    OutboxRow,
    ReconciliationReport,
    SiteSnapshot,
    fork_point,
    parse_timeline_history,
    compare_sites,
)
from cellplane_operator.errors import CellplaneError

__all__ = ["ReconciliationError", "read_snapshot", "read_fork_lsn", "read_end_lsn",
           "read_timeline", "read_lease_deadline", "build_report"]

# Whole tables: a cell is small enough, and a lost row can be anywhere. Rows are
# keyed by natural keys in the snapshot, never by ledger.entry_id: both primaries'
# sequences hand out the same values after the fork, to different entries.
SNAPSHOT_SITE_SQL = b"SELECT clock_timestamp(), (SELECT cell FROM placement_group)"
SNAPSHOT_JOBS_SQL = (b"SELECT tenant_id, job_id, status, claim_epoch, created_at, finished_at"
                     b" FROM jobs")
SNAPSHOT_LEDGER_SQL = b"SELECT tenant_id, job_id, kind, amount, created_at FROM ledger"
# "Delivered": an endpoint acknowledged it, so the tenant heard of it.
SNAPSHOT_OUTBOX_SQL = b"""
SELECT o.tenant_id, o.event_id, o.job_id, o.kind, o.created_at,
       EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id AND d.status = 'delivered')
  FROM outbox o
"""
SNAPSHOT_KEYS_SQL = b"SELECT tenant_id, key, job_id FROM idempotency_keys"

# pg_walfile_name() names the segment of the timeline the server writes now, from the
# moment promotion ends. pg_control_checkpoint().timeline_id would be the obvious
# source, but it keeps the parent's timeline until the first checkpoint after the
# promotion. pg_walfile_name() refuses during recovery, which is right for a new primary.
CURRENT_TIMELINE_SQL = b"SELECT pg_walfile_name(pg_current_wal_lsn())"
HISTORY_FILE_SQL = b"SELECT pg_read_file(%s)"
# An old primary opened for reading is a primary (read-only by default only), so its
# end of WAL is where it writes. Should it have been started as a standby instead, it
# writes nothing of its own: the end of what it replayed is its end.
END_OF_WAL_SQL = b"""
SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END
"""
# A standby's timeline is the one it replays, which pg_control_checkpoint() knows from
# its last restartpoint (pg_walfile_name() refuses during recovery).
TIMELINE_SQL = b"""
SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_lsn()) END,
       (SELECT timeline_id FROM pg_control_checkpoint())
"""
LEASE_DEADLINE_SQL = b"SELECT lease_deadline FROM placement_group"


class ReconciliationError(CellplaneError):
    """A site's rows or WAL positions could not be read for a reconciliation report."""


def read_snapshot(conninfo: str) -> SiteSnapshot:
    """Every job, ledger entry, outbox event and idempotency key of the site, as of one moment."""
    with _connect(conninfo, "snapshot") as conn:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with conn.transaction():
            read_at, cell = _one(conn, SNAPSHOT_SITE_SQL)
            jobs = [JobRow(*row) for row in conn.execute(SNAPSHOT_JOBS_SQL)]
            ledger = [LedgerRow(*row) for row in conn.execute(SNAPSHOT_LEDGER_SQL)]
            outbox = [OutboxRow(*row) for row in conn.execute(SNAPSHOT_OUTBOX_SQL)]
            keys = [IdempotencyKeyRow(*row) for row in conn.execute(SNAPSHOT_KEYS_SQL)]
    return SiteSnapshot.of(jobs=jobs, ledger=ledger, outbox=outbox, idempotency_keys=keys,
                           cell=cell, read_at=read_at)


def read_fork_lsn(new_primary_conninfo: str, *, old_timeline: int | None = None) -> str:
    """Where the new primary's history leaves ``old_timeline`` (by default: where its current
    timeline began), from its timeline history file."""
    with _connect(new_primary_conninfo, "fork LSN") as conn:
        (segment,) = _one(conn, CURRENT_TIMELINE_SQL)
        timeline = int(str(segment)[:8], 16)
        if timeline == 1:
            raise ReconciliationError(f"{_where(new_primary_conninfo)} is on timeline 1: it was "
                                      "never promoted, so it did not fork from another primary")
        (history,) = _one(conn, HISTORY_FILE_SQL, f"pg_wal/{timeline:08X}.history")
    try:
        return fork_point(parse_timeline_history(str(history)), old_timeline)
    except ValueError as error:
        raise ReconciliationError(f"timeline history {timeline:08X}.history of "
                                  f"{_where(new_primary_conninfo)}: {error}") from error


def read_end_lsn(old_conninfo: str) -> str:
    """The end of the old primary's WAL (what it replayed, should it be in recovery)."""
    with _connect(old_conninfo, "end of WAL") as conn:
        (lsn,) = _one(conn, END_OF_WAL_SQL)
    return str(lsn)


def read_timeline(conninfo: str) -> int:
    """The timeline the server writes (a primary) or replays (a standby)."""
    with _connect(conninfo, "timeline") as conn:
        segment, checkpoint_timeline = _one(conn, TIMELINE_SQL)
    return int(str(segment)[:8], 16) if segment is not None else int(checkpoint_timeline)


def read_lease_deadline(old_conninfo: str) -> datetime.datetime | None:
    with _connect(old_conninfo, "lease deadline") as conn:
        (deadline,) = _one(conn, LEASE_DEADLINE_SQL)
    return deadline if isinstance(deadline, datetime.datetime) else None


def build_report(old_conninfo: str, new_conninfo: str, *, cell: str, epoch: int, old_site: str,
                 new_site: str) -> ReconciliationReport:
    """The report of one failover. The old primary must run privately (no client writes to
    it any more) and the new one must have been promoted. The report is dated by the new
    primary's clock."""
    fork_lsn = read_fork_lsn(new_conninfo, old_timeline=read_timeline(old_conninfo))
    old_end_lsn = read_end_lsn(old_conninfo)
    old_lease_deadline = read_lease_deadline(old_conninfo)
    old = read_snapshot(old_conninfo)
    new = read_snapshot(new_conninfo)
    for snapshot, where in ((old, old_conninfo), (new, new_conninfo)):
        # Two databases of different cells would make a report of nonsense.
        if snapshot.cell != cell:
            raise ReconciliationError(f"{_where(where)} holds cell {snapshot.cell!r}, "
                                      f"not {cell!r}")
    assert new.read_at is not None
    return compare_sites(old, new, cell=cell, epoch=epoch, old_site=old_site, new_site=new_site,
                     fork_lsn=fork_lsn, old_end_lsn=old_end_lsn,
                     old_lease_deadline=old_lease_deadline, created_at=new.read_at)


@contextmanager
def _connect(conninfo: str, step: str) -> Iterator[psycopg.Connection[TupleRow]]:
    """A connection whose errors become ReconciliationError naming the site and the step."""
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            yield conn
    except psycopg.Error as error:
        raise ReconciliationError(f"reading the {step} of {_where(conninfo)} failed: "
                                  f"{error}") from error


def _one(conn: psycopg.Connection[TupleRow], sql: bytes, *params: Any) -> TupleRow:
    row = conn.execute(sql, params or None).fetchone()
    assert row is not None
    return row


def _where(conninfo: str) -> str:
    """The server and database, without whatever secret the conninfo holds."""
    parts = conninfo_to_dict(conninfo)
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"
