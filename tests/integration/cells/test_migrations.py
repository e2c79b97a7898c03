"""Migrations on a real Postgres: applied once, in order, idempotent, concurrent-safe."""

from __future__ import annotations

import threading

from cellfixtures import fetch
from cellplane_cells.migrate import available_migrations, migrate
from cellplane_operator.localplane import LocalControlPlane


def test_two_processes_starting_together_apply_each_migration_once(cell_postgres: LocalControlPlane) -> None:
    pg = cell_postgres.postgres["cell"]
    pg.execute('CREATE DATABASE "fresh"')
    conninfo = pg.dsn_for("fresh")
    applied: list[list[int]] = []
    barrier = threading.Barrier(2)

    def start() -> None:
        barrier.wait()
        applied.append(migrate(conninfo, cell="cell-a"))

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [m.number for m in available_migrations()]
    assert sorted(applied) == [[], everything]
    assert migrate(conninfo, cell="cell-a") == []
    assert fetch(conninfo, "SELECT number FROM schema_migrations ORDER BY number") == [
        (n,) for n in everything]
    # The placement group exists but grants nothing until an owner writes it.
    assert fetch(conninfo, "SELECT cell, epoch, lease_deadline FROM placement_group") == [
        ("cell-a", 0, None)]
