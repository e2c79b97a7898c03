"""Failover's database operations through the local site driver, against real Postgres.

Promote a standby, fence the old primary, rebuild it as a standby of the new
one (pg_rewind, or a base backup when rewind is impossible), and the two
measurements the region-loss issue asks for: ``default_transaction_read_only``
is no fence, and pg_rewind without a CHECKPOINT on the new primary finds
"no rewind required". Then the planned handover (demote cleanly, wait for the
standby to replay the shutdown checkpoint, promote), reading a fenced old
primary over its private socket, and re-pointing a standby of the old primary
at the promoted one.

As in ``test_local_sites.py``, the state dir is a fresh directory under the
system temp dir (Postgres runs as the ``postgres`` OS user, which cannot enter
pytest's ``tmp_path``), and the fixture checks that every site PID is gone.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from cellplane_operator.domain.reconciliation import lsn_to_int
from cellplane_operator.errors import SiteError
from cellplane_operator.localplane.postgres import postgres_os_user
from cellplane_operator.sites import DatabaseEndpoint, SiteKey
from cellplane_operator.sites.base import ServingSpec
from cellplane_operator.sites.state import DatabaseIntent
from sitefixtures import Sites, alive, run_sites

OLD = SiteKey("shared-f1", "region-a")
"""The primary that is lost, comes back, is fenced and rebuilt."""
NEW = SiteKey("shared-f1", "region-b")
"""Its standby, promoted."""
STRANGER = SiteKey("shared-f1", "region-c")
"""A primary of its own cluster: pg_rewind cannot make it a standby of NEW."""
OTHER = SiteKey("shared-f1", "region-d")
"""A second standby of OLD, re-pointed at NEW once NEW is promoted."""

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


async def _until(condition: Callable[[], bool | Awaitable[bool]], *, timeout: float,
                 what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        met = condition()
        if await met if inspect.isawaitable(met) else met:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _replayed(sites: Sites, site: SiteKey, lsn: str) -> bool:
    """The standby's replay, as ``check`` reports it, has reached ``lsn``."""
    replay = (await sites.driver.check(site)).replay_lsn
    return replay is not None and lsn_to_int(replay) >= lsn_to_int(lsn)


def _sender_port(standby: DatabaseEndpoint) -> int:
    """The port of the server the standby streams from right now."""
    rows = _execute(standby,
                    "SELECT sender_port FROM pg_stat_wal_receiver WHERE status = 'streaming'")
    assert len(rows) == 1, rows
    return int(rows[0][0])


async def _pair(sites: Sites) -> tuple[DatabaseEndpoint, DatabaseEndpoint]:
    """OLD a primary with rows 1-3, NEW its standby that has replayed them."""
    old = await sites.driver.ensure_primary_database(OLD)
    new = await sites.driver.ensure_standby_database(NEW, old)
    _execute(old, CREATE_TABLE)
    _insert(old, 1, 2, 3, note="before failover")
    await _until(lambda: _replayed_ids(new) == {1, 2, 3}, timeout=30,
                 what="the standby to replay 1-3")
    return old, new


def _replayed_ids(database: DatabaseEndpoint) -> set[int]:
    """``_ids``, or none while the standby has not yet replayed the table's creation (a busy
    machine replays later than the test asks)."""
    try:
        return _ids(database)
    except errors.UndefinedTable:
        return set()


def _rewind(sites: Sites, site: SiteKey, source: DatabaseEndpoint) -> str:
    """pg_rewind by hand, as the Postgres OS user (with that user's passfile); its combined
    output."""
    source_server = (f"host={source.host} port={source.port} user={source.user} dbname=postgres "
                     f"passfile={sites.layout(site).server_passfile}")
    result = subprocess.run(
        [sites.binaries.pg("pg_rewind"), f"--target-pgdata={sites.layout(site).data_dir}",
         f"--source-server={source_server}"],
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
    assert "scram-sha-256" in (layout.root / "pg_hba.conf.before-fence").read_text()
    for _ in range(2):
        health = await sites.driver.check(OLD)
        assert not health.database_up and health.restarted == ()
        assert sites.state(OLD).database == DatabaseIntent("fenced")
        assert "postgres" not in sites.state(OLD).processes
    await sites.driver.fence_database(OLD)  # idempotent, and Postgres is down: files only
    assert "scram-sha-256" in (layout.root / "pg_hba.conf.before-fence").read_text()

    began = time.monotonic()
    rebuilt = await sites.driver.rebuild_as_standby(OLD, new)
    rewind_seconds = time.monotonic() - began

    assert rebuilt == old
    assert sites.state(OLD).database == DatabaseIntent("standby", new.host, new.port)
    assert not (layout.root / "pg_hba.conf.before-fence").exists()
    assert "trust" not in (layout.data_dir / "pg_hba.conf").read_text()
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


def _grant(database: DatabaseEndpoint, epoch: int) -> None:
    """What the lease owner does before its processes start (a worker that the database
    refuses as stale stops, and its process exits)."""
    _execute(database, "SELECT cellplane_grant(%s, make_interval(secs => 3600))", (epoch,))


async def test_fencing_a_serving_primary_ends_its_api_and_workers_for_good(sites: Sites) -> None:
    old, new = await _pair(sites)
    _grant(old, 1)
    await sites.driver.start_serving(OLD, ServingSpec(epoch=1, admin_token="fence-test-token-0001",
                                                      allow_private_targets=True))
    serving = {role: pid for role, pid in sites.pids(OLD).items() if role != "postgres"}
    assert set(serving) == {"api", "worker-0"}
    await sites.driver.promote_database(NEW)
    await sites.driver.fence_database(OLD)
    assert not any(alive(pid) for pid in serving.values())
    assert sites.state(OLD).serving is None
    await sites.driver.rebuild_as_standby(OLD, new)
    # The standby it became must not get the old primary's API and workers back.
    health = await sites.driver.check(OLD)
    assert health.in_recovery and not health.serving and health.endpoints is None
    assert set(sites.state(OLD).processes) == {"postgres"}


async def test_a_standbys_warmed_up_api_is_adopted_when_it_takes_over(sites: Sites) -> None:
    _, new = await _pair(sites)
    spec = ServingSpec(epoch=2, admin_token="warm-test-token-00001", allow_private_targets=True)
    await sites.driver.warm_up(NEW, spec)
    warm = sites.pids(NEW)
    assert set(warm) == {"postgres", "api"}  # no workers on a standby
    health = await sites.driver.check(NEW)
    assert health.in_recovery and health.epoch == 2
    await sites.driver.promote_database(NEW)
    _grant(new, 2)
    await sites.driver.start_serving(NEW, spec)
    serving = sites.pids(NEW)
    assert serving["api"] == warm["api"] and "worker-0" in serving
    with pytest.raises(SiteError, match="not a standby"):
        await sites.driver.warm_up(NEW, spec)


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


async def test_a_clean_handover_loses_nothing_and_the_old_primary_follows_the_new_one(
        sites: Sites, caplog: pytest.LogCaptureFixture) -> None:
    """Demote OLD, wait until NEW's replay reaches the demote's LSN, promote NEW: NEW has
    every row OLD committed, and OLD rebuilt as its standby needs no rewind at all."""
    caplog.set_level(logging.INFO, logger="cellplane_operator.sites")
    assert await sites.driver.database_role(OLD) is None
    old, new = await _pair(sites)
    assert await sites.driver.database_role(OLD) == "primary"
    assert await sites.driver.database_role(NEW) == "standby"
    primary_health = await sites.driver.check(OLD)
    assert primary_health.replay_lsn is None and primary_health.receive_lsn is None
    standby_health = await sites.driver.check(NEW)
    assert standby_health.replay_lsn is not None and standby_health.receive_lsn is not None
    _insert(old, 4, 5, note="committed just before the handover")
    postmaster = sites.pids(OLD)["postgres"]

    began = time.monotonic()
    lsn = await sites.driver.demote_for_handover(OLD)
    demote_seconds = time.monotonic() - began

    assert not alive(postmaster)
    assert await sites.driver.database_role(OLD) == "demoted"
    control = sites.control_data(OLD)
    assert control["Database cluster state"] == "shut down"
    assert control["Latest checkpoint location"] == lsn
    assert await sites.driver.demote_for_handover(OLD) == lsn  # idempotent
    for _ in range(2):
        health = await sites.driver.check(OLD)
        assert not health.database_up and health.restarted == ()
        assert "postgres" not in sites.state(OLD).processes
    began = time.monotonic()
    await _until(lambda: _replayed(sites, NEW, lsn), timeout=30,
                 what="NEW to replay the shutdown checkpoint")
    catch_up_seconds = time.monotonic() - began
    assert _ids(new) == {1, 2, 3, 4, 5}

    await sites.driver.promote_database(NEW)
    _insert(new, 10, note="on the new primary, after the handover")
    began = time.monotonic()
    assert await sites.driver.rebuild_as_standby(OLD, new) == old
    rebuild_seconds = time.monotonic() - began

    assert "no rewind required" in sites.postgres_log(OLD)
    assert any("rebuilt as a standby" in r.getMessage() and "by pg_rewind" in r.getMessage()
               for r in caplog.records)
    assert await sites.driver.database_role(OLD) == "standby"
    await _until(lambda: 10 in _ids(old), timeout=30, what="row 10 to stream to OLD")
    assert _ids(old) == {1, 2, 3, 4, 5, 10}
    assert _sender_port(old) == new.port
    print(f"\nTIMING demote {demote_seconds:.2f}s, standby caught up {catch_up_seconds:.2f}s "
          f"after it, rebuild (no rewind required) {rebuild_seconds:.2f}s")


async def test_a_demoted_primary_stays_down_until_the_handover_is_given_up(sites: Sites) -> None:
    """Demoted, OLD is neither restarted by ``check`` nor usable as anything but a primary
    again: ``ensure_primary_database`` (the abort path) starts it, closing a reading of it
    first, and its standby streams from it again."""
    old, new = await _pair(sites)
    with pytest.raises(SiteError, match="not a primary"):
        await sites.driver.demote_for_handover(NEW)
    await sites.driver.demote_for_handover(OLD)
    with pytest.raises(SiteError, match="demoted"):
        await sites.driver.promote_database(OLD)
    with pytest.raises(SiteError, match="demoted"):
        await sites.driver.ensure_standby_database(OLD, new)
    health = await sites.driver.check(OLD)
    assert not health.database_up and health.restarted == ()

    reading = await sites.driver.open_fenced_for_reading(OLD)
    with psycopg.connect(reading, connect_timeout=5) as conn:
        assert {row[0] for row in conn.execute("SELECT id FROM probe")} == {1, 2, 3}
    began = time.monotonic()
    assert await sites.driver.ensure_primary_database(OLD) == old
    abort_seconds = time.monotonic() - began

    assert sites.state(OLD).database == DatabaseIntent("primary")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(reading, connect_timeout=2).close()
    _insert(old, 6, note="after the handover was given up")
    await _until(lambda: 6 in _ids(new), timeout=30, what="NEW to stream from OLD again")
    health = await sites.driver.check(OLD)
    assert health.database_up and health.in_recovery is False and health.restarted == ()
    print(f"\nTIMING handover given up (reading closed, started as primary) {abort_seconds:.2f}s")


async def test_demote_refuses_a_primary_that_crashed(sites: Sites) -> None:
    """After a crash the last checkpoint is not the end of the WAL: no LSN is returned, and
    ``ensure_primary_database`` recovers the site and keeps what it committed."""
    old = await sites.driver.ensure_primary_database(OLD)
    _execute(old, CREATE_TABLE)
    _insert(old, 1, note="before the crash")
    postmaster = sites.pids(OLD)["postgres"]
    os.kill(postmaster, signal.SIGKILL)
    await _until(lambda: not alive(postmaster), timeout=10, what="the postmaster to die")

    with pytest.raises(SiteError, match="not shut down cleanly"):
        await sites.driver.demote_for_handover(OLD)

    assert await sites.driver.database_role(OLD) == "demoted"
    assert await sites.driver.ensure_primary_database(OLD) == old
    assert _ids(old) == {1}


async def test_a_fenced_primary_that_crashed_opens_for_reading_over_a_private_socket_only(
        sites: Sites, caplog: pytest.LogCaptureFixture) -> None:
    """OLD took a stale write, crashed and was fenced while down. Opened for reading, it
    recovers, shows the stale row over the returned conninfo, takes no write, listens on no
    TCP port, and is not restarted by ``check``; closed, it rewinds onto NEW."""
    caplog.set_level(logging.INFO, logger="cellplane_operator.sites")
    old, new = await _pair(sites)
    await sites.driver.promote_database(NEW)
    _insert(new, 10, 11, note="on the new primary")
    _insert(old, 100, note="stale primary, after the promotion")
    postmaster = sites.pids(OLD)["postgres"]
    os.kill(postmaster, signal.SIGKILL)
    await _until(lambda: not alive(postmaster), timeout=10, what="the postmaster to die")
    await sites.driver.fence_database(OLD)
    with pytest.raises(SiteError, match="fenced"):
        await sites.driver.ensure_primary_database(OLD)

    began = time.monotonic()
    reading = await sites.driver.open_fenced_for_reading(OLD)
    open_seconds = time.monotonic() - began

    assert "automatic recovery in progress" in sites.postgres_log(OLD)
    with psycopg.connect(reading, autocommit=True, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("cellplane",)
        assert {row[0] for row in conn.execute("SELECT id FROM probe")} == {1, 2, 3, 100}
        with pytest.raises(errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO probe VALUES (101, 'a reader takes no write')")
    with pytest.raises(psycopg.OperationalError, match="Connection refused"):
        psycopg.connect(old.conninfo, connect_timeout=2).close()
    layout = sites.layout(OLD)
    private = (layout.root / "reading").stat()
    assert private.st_mode & 0o777 == 0o700
    if (os_user := postgres_os_user()) is not None:
        assert private.st_uid == pwd.getpwnam(os_user).pw_uid
    assert "reject" in (layout.data_dir / "pg_hba.conf").read_text()
    reader = sites.pids(OLD)["postgres"]
    health = await sites.driver.check(OLD)
    assert not health.database_up and health.restarted == ()
    assert await sites.driver.database_role(OLD) == "fenced"
    assert await sites.driver.open_fenced_for_reading(OLD) == reading  # idempotent: adopted
    assert sites.pids(OLD)["postgres"] == reader

    began = time.monotonic()
    await sites.driver.close_fenced_reading(OLD)
    close_seconds = time.monotonic() - began
    assert not alive(reader)
    assert sites.control_data(OLD)["Database cluster state"] == "shut down"
    await sites.driver.close_fenced_reading(OLD)  # idempotent

    await sites.driver.rebuild_as_standby(OLD, new)
    assert "servers diverged at WAL location" in sites.postgres_log(OLD)
    assert not any("falling back" in r.getMessage() for r in caplog.records)
    assert _ids(old) == {1, 2, 3, 10, 11}
    print(f"\nTIMING open for reading after a crash {open_seconds:.2f}s, "
          f"close {close_seconds:.2f}s")


@pytest.mark.parametrize("after", ["handover", "failover"])
async def test_a_standby_of_the_old_primary_is_repointed_at_the_promoted_one(
        sites: Sites, caplog: pytest.LogCaptureFixture, after: str) -> None:
    """OTHER, a second standby of OLD, is re-pointed at NEW by ``ensure_standby_database``.
    After a handover both standbys replayed all of OLD, so pg_rewind finds nothing to do;
    after a failover OTHER replayed a stale write NEW never had, so pg_rewind removes it."""
    caplog.set_level(logging.INFO, logger="cellplane_operator.sites")
    old, new = await _pair(sites)
    other = await sites.driver.ensure_standby_database(OTHER, old)
    await _until(lambda: _ids(other) == {1, 2, 3}, timeout=30, what="OTHER to replay 1-3")
    if after == "handover":
        lsn = await sites.driver.demote_for_handover(OLD)
        for standby in (NEW, OTHER):
            await _until(lambda: _replayed(sites, standby, lsn), timeout=30,
                         what=f"{standby.name} to replay the shutdown checkpoint")
        await sites.driver.promote_database(NEW)
    else:
        await sites.driver.promote_database(NEW)
        _insert(old, 100, note="stale primary: OTHER replays it, NEW never has it")
        await _until(lambda: 100 in _ids(other), timeout=30, what="OTHER to replay row 100")
        await sites.driver.fence_database(OLD)
    _insert(new, 10, note="on the new primary")

    began = time.monotonic()
    assert await sites.driver.ensure_standby_database(OTHER, new) == other
    repoint_seconds = time.monotonic() - began

    said = sites.postgres_log(OTHER)
    if after == "handover":
        assert "no rewind required" in said
    else:
        assert "servers diverged at WAL location" in said
    assert any("re-pointed as a standby" in r.getMessage() and "by pg_rewind" in r.getMessage()
               for r in caplog.records)
    assert sites.state(OTHER).database == DatabaseIntent("standby", new.host, new.port)
    await _until(lambda: 10 in _ids(other), timeout=30, what="row 10 to stream to OTHER")
    assert _ids(other) == {1, 2, 3, 10}
    assert _sender_port(other) == new.port
    health = await sites.driver.check(OTHER)
    assert health.in_recovery and health.streaming and health.restarted == ()
    postmaster = sites.pids(OTHER)["postgres"]
    assert await sites.driver.ensure_standby_database(OTHER, new) == other  # idempotent
    assert sites.pids(OTHER)["postgres"] == postmaster
    print(f"\nTIMING re-point after a {after} {repoint_seconds:.2f}s")


async def test_check_does_not_start_a_standby_without_its_standby_signal(sites: Sites) -> None:
    """A re-point cut short after pg_rewind (which removes standby.signal) leaves a standby
    that would come up as a primary: ``check`` leaves it down until the signal is back."""
    _, new = await _pair(sites)
    postmaster = sites.pids(NEW)["postgres"]
    os.kill(postmaster, signal.SIGKILL)
    await _until(lambda: not alive(postmaster), timeout=10, what="the postmaster to die")
    signal_file = sites.layout(NEW).data_dir / "standby.signal"
    signal_file.rename(signal_file.with_suffix(".away"))

    health = await sites.driver.check(NEW)
    assert not health.database_up and health.restarted == ()

    signal_file.with_suffix(".away").rename(signal_file)
    health = await sites.driver.check(NEW)
    assert health.database_up and health.in_recovery and health.restarted == ("postgres",)
