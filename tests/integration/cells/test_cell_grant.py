"""The lease holder's grant in the cell database survives the loss of its kept connection.

A site that was primary, was demoted and rewound, and is promoted again keeps its
address; the grant's connection to it died with the old server. The next grant
must land all the same, or the new epoch's processes are refused as stale until
the next renewal (found by benchmarks/switchover.py).
"""

from __future__ import annotations

import psycopg

from cellplane_operator.ownership.cell_grant import CellDatabaseGrant


async def test_a_grant_reconnects_when_its_kept_connection_was_terminated(cell_db: str) -> None:
    grant = CellDatabaseGrant(cell_db)
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
    grant = CellDatabaseGrant(cell_db)
    await grant.start_acting(4, 30.0)
    await grant.renew_grant(4, 30.0)
    with psycopg.connect(cell_db, autocommit=True) as conn:
        row = conn.execute("SELECT epoch, lease_deadline > now() FROM placement_group").fetchone()
    assert row == (4, True)
    assert grant.last_grant == (4, 30.0)
