"""The lease holder's grant in the cell database survives the loss of its kept connection.

A site that was primary, was demoted and rewound, and is promoted again keeps its
address; the grant's connection to it died with the old server. The next grant
must land all the same, or the new epoch's processes are refused as stale until
the next renewal (found by benchmarks/switchover.py).
"""

from __future__ import annotations

import psycopg

from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.sites.celldb import PostgresCellDatabases


async def test_a_grant_reconnects_when_its_kept_connection_was_terminated(cell_db: str) -> None:
    grant = CellDatabaseGrant(PostgresCellDatabases(), cell_db)
    await grant.start_acting(2, 30.0)
    with psycopg.connect(cell_db, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND datname = current_database()").fetchone()
        assert ended == (1,)
        await grant.start_acting(3, 30.0)
        row = conn.execute("SELECT epoch, lease_deadline > now() FROM placement_group").fetchone()
    assert row == (3, True)
    assert grant.last_grant == (3, 30.0)


async def test_a_grant_to_a_cell_database_without_migration_0007_still_lands(cell_db: str) -> None:
    """An operator upgraded before its cells (the site migrates when it is next ensured)
    must keep renewing: it falls back to the two-argument grant of migration 0002."""
    with psycopg.connect(cell_db, autocommit=True) as conn:
        conn.execute("DROP FUNCTION cellplane_grant(bigint, interval, text)")
        conn.execute("""
            CREATE OR REPLACE FUNCTION cellplane_grant(new_epoch bigint, remaining interval)
            RETURNS timestamptz LANGUAGE sql AS $$
                UPDATE placement_group SET epoch = new_epoch,
                       lease_deadline = clock_timestamp() + remaining
                 WHERE epoch <= new_epoch RETURNING lease_deadline
            $$""")
    grant = CellDatabaseGrant(PostgresCellDatabases(), cell_db)
    await grant.start_acting(4, 30.0)
    await grant.renew_grant(4, 30.0)
    with psycopg.connect(cell_db, autocommit=True) as conn:
        row = conn.execute("SELECT epoch, lease_deadline > now() FROM placement_group").fetchone()
    assert row == (4, True)
    assert grant.last_grant == (4, 30.0)


async def test_a_stop_after_the_deadline_keeps_the_deadline_that_was_in_force(cell_db: str) -> None:
    """An owner paused past its lease self-fences when it resumes: its zero grant must not
    move the old primary's deadline to that moment, which the reconciliation report reads
    as the deadline in force (issue #18 item 15)."""
    grant = CellDatabaseGrant(PostgresCellDatabases(), cell_db)
    await grant.start_acting(2, 0.2)
    with psycopg.connect(cell_db, autocommit=True) as conn:
        [(in_force,)] = conn.execute("SELECT lease_deadline FROM placement_group").fetchall()
        # Past the deadline by the database's own clock, as a paused operator is.
        conn.execute("SELECT pg_sleep(greatest(extract(epoch FROM %s - clock_timestamp()), 0)"
                     " + 0.2)", (in_force,))
        await grant.stop_acting(2, "self-fenced: no renewal confirmed before deadline - margin")
        [(after_stop,)] = conn.execute("SELECT lease_deadline FROM placement_group").fetchall()
        assert after_stop == in_force
        # A stop before the deadline still ends the write time now.
        await grant.start_acting(3, 30.0)
        await grant.stop_acting(3, "released")
        [(ended, passed)] = conn.execute(
            "SELECT lease_deadline, lease_deadline <= clock_timestamp() FROM placement_group"
        ).fetchall()
    assert passed and ended > in_force
