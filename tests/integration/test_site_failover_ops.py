"""Failover's database operations through the local site driver, against real Postgres.

Promote a standby, fence the old primary, rebuild it as a standby of the new
one (pg_rewind, or a base backup when rewind is impossible), and the two
measurements the region-loss issue asks for: ``default_transaction_read_only``
is no fence, and pg_rewind without a CHECKPOINT on the new primary finds
"no rewind required".

As in ``test_local_sites.py``, the state dir is a fresh directory under the
system temp dir (Postgres runs as the ``postgres`` OS user, which cannot enter
pytest's ``tmp_path``), and the fixture checks that every site PID is gone.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from cellplane_operator.localplane.postgres import postgres_os_user
from cellplane_operator.sites import DatabaseEndpoint, SiteKey
from cellplane_operator.sites.state import DatabaseIntent
from sitefixtures import Sites, alive, run_sites

OLD = SiteKey("shared-f1", "region-a")
"""The primary that is lost, comes back, is fenced and rebuilt."""
NEW = SiteKey("shared-f1", "region-b")
"""Its standby, promoted."""
STRANGER = SiteKey("shared-f1", "region-c")
"""A primary of its own cluster: pg_rewind cannot make it a standby of NEW."""

CREATE_TABLE = "CREATE TABLE probe (id int PRIMARY KEY, note text NOT NULL)"


@pytest.fixture
def sites(request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from run_sites(request, "cellplane-failover-")


def _execute(database: DatabaseEndpoint, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(database.conninfo, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(sql.encode(), params)
        return list(cursor.fetchall()) if cursor.description else []


def _insert(database: DatabaseEndpoint, *ids: int, note: str) -> None:
    for i in ids:
        _execute(database, "INSERT INTO probe VALUES (%s, %s)", (i, note))


def _ids(database: DatabaseEndpoint) -> set[int]:
    return {row[0] for row in _execute(database, "SELECT id FROM probe")}


async def _until(condition: Any, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _pair(sites: Sites) -> tuple[DatabaseEndpoint, DatabaseEndpoint]:
    """OLD a primary with rows 1-3, NEW its standby that has replayed them."""
    old = await sites.driver.ensure_primary_database(OLD)
    new = await sites.driver.ensure_standby_database(NEW, old)
    _execute(old, CREATE_TABLE)
    _insert(old, 1, 2, 3, note="before failover")
    await _until(lambda: _ids(new) == {1, 2, 3}, timeout=30, what="the standby to replay 1-3")
    return old, new


def _rewind(sites: Sites, site: SiteKey, source: DatabaseEndpoint) -> str:
    """pg_rewind by hand, as the Postgres OS user; its combined output."""
    result = subprocess.run(
        [sites.binaries.pg("pg_rewind"), f"--target-pgdata={sites.layout(site).data_dir}",
         f"--source-server={source.conninfo}"],
        user=postgres_os_user(), capture_output=True, text=True, check=False, timeout=300,
        stdin=subprocess.DEVNULL, cwd="/")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


async def test_promote_fence_and_rebuild_lose_only_the_stale_primary_write(
        sites: Sites, caplog: pytest.LogCaptureFixture) -> None:
    """Failover end to end; the row OLD committed after NEW's promotion is gone after the rewind.

    That loss (row 100 here) is what the region-loss reconciliation report must record.
    """
    caplog.set_level(logging.INFO, logger="cellplane_operator.sites")
    old, new = await _pair(sites)

    began = time.monotonic()
    promoted = await sites.driver.promote_database(NEW)
    promote_seconds = time.monotonic() - began
    assert promoted == new
    assert _execute(new, "SELECT pg_is_in_recovery()") == [(False,)]
    assert sites.state(NEW).database == DatabaseIntent("primary")
    assert await sites.driver.promote_database(NEW) == new  # idempotent on a primary
    _insert(new, 10, 11, note="on the new primary")
    # The stale-primary write: OLD still runs and still takes writes.
    _insert(old, 100, note="stale primary, after the promotion")

    before_fence = psycopg.connect(old.conninfo, autocommit=True)
    try:
        assert before_fence.execute("SELECT 1").fetchone() == (1,)
        old_postmaster = sites.state(OLD).processes["postgres"].pid
        began = time.monotonic()
        await sites.driver.fence_database(OLD)
        fence_seconds = time.monotonic() - began
        with pytest.raises(psycopg.OperationalError):
            before_fence.execute("SELECT 1")
    finally:
        before_fence.close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(old.conninfo, connect_timeout=2).close()
    assert not alive(old_postmaster)
    assert any("fenced in" in r.getMessage() and "(1 sessions terminated)" in r.getMessage()
               for r in caplog.records), "the open session was not terminated before the stop"
    layout = sites.layout(OLD)
    assert "reject" in (layout.data_dir / "pg_hba.conf").read_text()
    assert "trust" in (layout.root / "pg_hba.conf.before-fence").read_text()
    for _ in range(2):
        health = await sites.driver.check(OLD)
        assert not health.database_up and health.restarted == ()
        assert sites.state(OLD).database == DatabaseIntent("fenced")
        assert "postgres" not in sites.state(OLD).processes
    await sites.driver.fence_database(OLD)  # idempotent, and Postgres is down: files only
    assert "trust" in (layout.root / "pg_hba.conf.before-fence").read_text()

    began = time.monotonic()
    rebuilt = await sites.driver.rebuild_as_standby(OLD, new)
    rewind_seconds = time.monotonic() - began

    assert rebuilt == old
    assert sites.state(OLD).database == DatabaseIntent("standby", new.host, new.port)
    assert not (layout.root / "pg_hba.conf.before-fence").exists()
    await _until(lambda: _ids(old) == {1, 2, 3, 10, 11}, timeout=30,
                 what="the rebuilt standby to have the new primary's rows")
    assert 100 not in _ids(old)
    _insert(new, 12, note="streamed after the rebuild")
    await _until(lambda: 12 in _ids(old), timeout=30, what="row 12 to stream to OLD")
    health = await sites.driver.check(OLD)
    assert health.database_up and health.in_recovery and health.streaming
    assert health.restarted == ()
    assert _execute(old, "SELECT pg_is_in_recovery()") == [(True,)]
    with pytest.raises(errors.ReadOnlySqlTransaction):
        _insert(old, 13, note="a standby takes no write")
    assert any("falling back" not in r.getMessage() and "by pg_rewind" in r.getMessage()
               for r in caplog.records)
    assert await sites.driver.rebuild_as_standby(OLD, new) == old  # idempotent
    print(f"\nTIMING promote+checkpoint {promote_seconds:.2f}s, fence {fence_seconds:.2f}s, "
          f"rebuild by pg_rewind {rewind_seconds:.2f}s")


async def test_rebuild_falls_back_to_a_base_backup_when_rewind_is_impossible(
        sites: Sites, caplog: pytest.LogCaptureFixture) -> None:
    """A primary of another cluster (another system identifier) cannot be rewound onto NEW:
    the rebuild says so in the log and takes a fresh base backup instead."""
    _, new = await _pair(sites)
    await sites.driver.promote_database(NEW)
    stranger = await sites.driver.ensure_primary_database(STRANGER)
    await sites.driver.fence_database(STRANGER)

    began = time.monotonic()
    rebuilt = await sites.driver.rebuild_as_standby(STRANGER, new)
    backup_seconds = time.monotonic() - began

    assert rebuilt == stranger
    assert any("falling back to a fresh base backup" in r.getMessage() for r in caplog.records)
    assert not (sites.layout(STRANGER).root / "pgdata.before-rebuild").exists()
    assert _ids(stranger) == {1, 2, 3}
    assert _execute(stranger, "SELECT pg_is_in_recovery()") == [(True,)]
    assert sites.state(STRANGER).database == DatabaseIntent("standby", new.host, new.port)
    _insert(new, 20, note="streamed to the base backup")
    await _until(lambda: 20 in _ids(stranger), timeout=30, what="row 20 to stream")
    print(f"\nTIMING rebuild by base backup (after a failed pg_rewind) {backup_seconds:.2f}s")


async def test_default_transaction_read_only_is_not_a_fence(sites: Sites) -> None:
    """Observed: with ``default_transaction_read_only = on`` set by ALTER SYSTEM and reloaded,
    a plain INSERT fails, but a client that says ``SET default_transaction_read_only = off``
    or ``BEGIN READ WRITE`` writes, and a transaction opened before the change commits."""
    primary = await sites.driver.ensure_primary_database(OLD)
    _execute(primary, CREATE_TABLE)
    with psycopg.connect(primary.conninfo) as early:  # a transaction, open across the change
        early.execute("INSERT INTO probe VALUES (1, 'opened before the change')")

        _execute(primary, "ALTER SYSTEM SET default_transaction_read_only = on")
        _execute(primary, "SELECT pg_reload_conf()")
        await _until(lambda: _execute(primary, "SHOW default_transaction_read_only") == [("on",)],
                     timeout=10, what="the reload")
        with pytest.raises(errors.ReadOnlySqlTransaction):
            _insert(primary, 2, note="plain write")
        with psycopg.connect(primary.conninfo, autocommit=True) as client:
            client.execute("SET default_transaction_read_only = off")
            client.execute("INSERT INTO probe VALUES (3, 'after SET ... = off')")
        with psycopg.connect(primary.conninfo, autocommit=True) as client:
            client.execute("BEGIN READ WRITE")
            client.execute("INSERT INTO probe VALUES (4, 'in BEGIN READ WRITE')")
            client.execute("COMMIT")
        early.commit()

    assert _ids(primary) == {1, 3, 4}


async def test_pg_rewind_without_checkpoint_on_the_new_primary_finds_nothing_to_rewind(
        sites: Sites) -> None:
    """Observed: NEW promoted by hand (pg_promote, no CHECKPOINT), OLD diverged by a write
    after the promotion and fenced: pg_rewind prints "no rewind required". After a
    CHECKPOINT on NEW the same pg_rewind finds the divergence and rewinds."""
    old, new = await _pair(sites)
    assert _execute(new, "SELECT pg_promote(true, 60)") == [(True,)]
    _insert(old, 100, note="diverges OLD from NEW")
    await sites.driver.fence_database(OLD)

    output = _rewind(sites, OLD, new)
    print(f"\nPG_REWIND without checkpoint:\n{output}")
    assert "no rewind required" in output

    _execute(new, "CHECKPOINT")
    output = _rewind(sites, OLD, new)
    print(f"\nPG_REWIND after checkpoint:\n{output}")
    assert "no rewind required" not in output
    assert "servers diverged at WAL location" in output
