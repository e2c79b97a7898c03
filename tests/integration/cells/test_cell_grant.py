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
