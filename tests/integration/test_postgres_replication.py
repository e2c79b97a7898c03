"""Real PostgreSQL 15: a primary and a streaming standby made with pg_basebackup -R."""

from __future__ import annotations

import psycopg
import pytest

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.process import wait_for


def test_row_written_on_primary_is_read_on_standby_then_standby_promotes(
    bare_plane: LocalControlPlane,
) -> None:
    primary = bare_plane.add_postgres("cell-a-primary")
    primary.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, tenant text NOT NULL)")
    standby = bare_plane.add_standby("cell-a-standby", primary=primary)

    assert standby.in_recovery()
    # pg_rewind, which rebuilds a fenced old primary later, needs checksums.
    assert primary.execute("SHOW data_checksums") == [("on",)]

    primary.execute("INSERT INTO jobs VALUES (1, 'acme')")
    wait_for(lambda: standby.execute("SELECT tenant FROM jobs WHERE id = 1") == [("acme",)],
             timeout=30, what="the row to replicate to the standby")

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        standby.execute("INSERT INTO jobs VALUES (2, 'globex')")

    standby.promote()

    assert not standby.in_recovery()
    standby.execute("INSERT INTO jobs VALUES (2, 'globex')")
    assert standby.execute("SELECT id, tenant FROM jobs ORDER BY id") == [(1, "acme"), (2, "globex")]


def test_standby_streams_from_the_primary_it_was_made_of(bare_plane: LocalControlPlane) -> None:
    primary = bare_plane.add_postgres("primary")
    standby = bare_plane.add_standby("standby", primary=primary)

    def streaming() -> bool:
        rows = primary.execute("SELECT state FROM pg_stat_replication")
        return rows == [("streaming",)]

    wait_for(streaming, timeout=30, what="the standby to stream from the primary")
    receiver = standby.execute("SELECT status, sender_port FROM pg_stat_wal_receiver")
    assert receiver == [("streaming", primary.port)]
