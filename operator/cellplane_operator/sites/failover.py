"""A site's database through a failover (promote the standby, fence the old primary,
rebuild it as a standby of the new one) and through a planned handover (demote the
primary cleanly, so a standby can be shown to hold all it wrote, then the same).

Each lever of the fence is there because none is enough alone
(tests/integration/test_site_failover_ops.py measures why):
``default_transaction_read_only`` is not one at all, since any client turns it off and an
open transaction still commits; a pg_hba that rejects stops new sessions only;
terminating sessions ends the open ones; the stop ends the rest. The rebuild
prefers pg_rewind, which needs a checkpoint on the new primary first (without
it pg_rewind reads the old timeline from pg_control and reports "no rewind
required" however far the two diverged), and falls back to a fresh base backup.

A demote is a fast shutdown: the server writes a shutdown checkpoint as its last
WAL record and its WAL senders send everything up to it before they exit, so a
standby whose replay reaches that checkpoint has every write, and promoting it
forks the history after the old primary's end (pg_rewind then has nothing to do).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Collection
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from cellplane_operator.errors import CellplaneError, SiteError
from cellplane_operator.localplane.process import run_checked, tail
from cellplane_operator.metrics import old_primary_fenced, old_primary_rebuilt
from cellplane_operator.sites.base import DatabaseEndpoint, SiteKey
from cellplane_operator.sites.database import SiteDatabase, write_primary_conninfo
from cellplane_operator.sites.state import SiteLayout, SiteState

__all__ = ["FENCED", "DEMOTED", "KEPT_DOWN", "ASIDE_DATA_DIR", "promote", "fence", "demote",
           "rewind_or_clone", "restore_hba", "write_standby_config", "refuse_role"]

log = logging.getLogger(__name__)

FENCED = "fenced"
"""The database intent of an old primary: stopped, rejecting, not restarted by ``check``."""
DEMOTED = "demoted"
"""The database intent of a primary handing over: stopped cleanly, not restarted by ``check``."""
KEPT_DOWN = frozenset({FENCED, DEMOTED})
"""Intents whose Postgres runs only opened for reading or once rebuilt as a standby."""
CLEANLY_SHUT_DOWN = "shut down"
"""pg_controldata's cluster state after a clean shutdown of a primary."""
HBA_BACKUP = "pg_hba.conf.before-fence"
"""The site's own pg_hba.conf while fenced; beside the data dir, which pg_rewind rewrites."""
ASIDE_DATA_DIR = "pgdata.before-rebuild"
"""Where a data dir that pg_rewind could not rewind waits until its base backup runs."""
PROMOTE_WAIT_SECONDS = 60
# Rejects everything the site's clusters accept (``localplane.postgres``), and the rest.
REJECT_HBA = """\
# Fenced by cellplane: this old primary accepts no connection until it is rebuilt.
local   all             all                             reject
host    all             all             0.0.0.0/0       reject
host    all             all             ::/0            reject
host    replication     all             0.0.0.0/0       reject
host    replication     all             ::/0            reject
"""
PROMOTE_SQL = b"SELECT pg_promote(true, %s)"
IN_RECOVERY_SQL = b"SELECT pg_is_in_recovery()"
RELOAD_SQL = b"SELECT pg_reload_conf()"
# Client sessions and WAL senders; background workers are the server's own and
# end with the shutdown. Waits up to 5 s for each to be gone.
TERMINATE_SQL = b"""
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender')
"""


def promote(site: SiteKey, db: SiteDatabase) -> None:
    """Ends recovery (a no-op on a primary), then checkpoints the new timeline."""
    began = promoted = time.monotonic()
    try:
        with psycopg.connect(db.dsn(), autocommit=True, connect_timeout=5) as conn:
            in_recovery = _scalar(conn, IN_RECOVERY_SQL)
            if in_recovery and not _scalar(conn, PROMOTE_SQL, PROMOTE_WAIT_SECONDS):
                raise SiteError(f"{site.name} did not finish promotion in "
                                f"{PROMOTE_WAIT_SECONDS}s; log {db.log}:\n{tail(db.log)}")
            promoted = time.monotonic()
            # The new timeline reaches pg_control only with a checkpoint; before
            # it, pg_rewind against this server finds "no rewind required".
            conn.execute(b"CHECKPOINT")
    except psycopg.Error as error:
        raise SiteError(f"promoting {site.name} failed: {error}") from error
    if in_recovery:
        log.info("%s: promoted in %.2fs, checkpointed in %.2fs", site.name,
                 promoted - began, time.monotonic() - promoted)


def fence(site: SiteKey, layout: SiteLayout, db: SiteDatabase, *, running: bool,
          stop: Callable[[], object]) -> None:
    """pg_hba rejecting everything, reloaded; client sessions terminated; then ``stop``."""
    began = time.monotonic()
    hba = db.data_dir / "pg_hba.conf"
    backup = layout.root / HBA_BACKUP
    if hba.exists() and not backup.exists():
        shutil.copyfile(hba, backup)
    # Written in place: the file keeps its owner, the Postgres OS user.
    hba.write_text(REJECT_HBA)
    terminated = 0
    if running:
        try:
            with psycopg.connect(db.dsn(), autocommit=True, connect_timeout=5) as conn:
                conn.execute(RELOAD_SQL)
                terminated = int(_scalar(conn, TERMINATE_SQL))
        except psycopg.Error as error:
            # Already rejecting (a fence cut short) or dying: the stop still fences.
            log.warning("%s: could not reload and terminate before the stop: %s",
                        site.name, error)
    stop()
    old_primary_fenced(site.cell, site.region)
    log.info("%s: fenced in %.2fs (%d sessions terminated)", site.name,
             time.monotonic() - began, terminated)


def demote(site: SiteKey, db: SiteDatabase, *, stop: Callable[[], object]) -> str:
    """``stop`` (a fast shutdown), then the location of the shutdown checkpoint it wrote."""
    began = time.monotonic()
    stop()
    control = db.control_data()
    state = control.get("Database cluster state")
    if state != CLEANLY_SHUT_DOWN:
        # After a crash the last checkpoint is not the end of the WAL: no location
        # would prove that a standby holds every write.
        raise SiteError(f"{site.name} was not shut down cleanly (cluster state {state!r}), so "
                        "the end of its WAL is unknown: give the handover up "
                        "(ensure_primary_database starts it again, recovering it)")
    lsn = control["Latest checkpoint location"]
    log.info("%s: demoted in %.2fs, shutdown checkpoint at %s", site.name,
             time.monotonic() - began, lsn)
    return lsn


def rewind_or_clone(site: SiteKey, layout: SiteLayout, db: SiteDatabase,
                    primary: DatabaseEndpoint, *, pg_rewind: str, os_user: str | None) -> str:
    """Makes the stopped data dir a copy of ``primary``'s timeline; says how."""
    aside = layout.root / ASIDE_DATA_DIR
    try:
        if aside.exists():
            # An earlier fallback stopped half-way: the original is the one aside.
            raise SiteError(f"{aside} holds the data of an unfinished base backup")
        run_checked([pg_rewind, f"--target-pgdata={db.data_dir}",
                     f"--source-server={db.rewind_source(primary)}", "--progress"],
                    log=db.log, user=os_user)
        old_primary_rebuilt(site.cell, site.region, "pg_rewind")
        return "pg_rewind"
    except CellplaneError as error:
        log.warning("%s: pg_rewind failed, falling back to a fresh base backup (the old "
                    "data dir waits in %s until it works): %s", site.name, aside, error)
        if not aside.exists():
            db.data_dir.rename(aside)
        db.init_standby(primary)
        old_primary_rebuilt(site.cell, site.region, "base backup")
        return "base backup"


def restore_hba(layout: SiteLayout, db: SiteDatabase) -> None:
    backup = layout.root / HBA_BACKUP
    if backup.exists():
        (db.data_dir / "pg_hba.conf").write_text(backup.read_text())
        backup.unlink()


def refuse_role(site: SiteKey, state: SiteState, roles: Collection[str], what: str) -> None:
    if state.database is not None and state.database.role in roles:
        raise SiteError(f"{site.name} is {state.database.role}: it cannot be {what}")


def _scalar(conn: psycopg.Connection[TupleRow], sql: bytes, *params: object) -> Any:
    row = conn.execute(sql, params or None).fetchone()
    assert row is not None
    return row[0]


def write_standby_config(db: SiteDatabase, primary: DatabaseEndpoint) -> None:
    """``standby.signal`` and ``primary_conninfo``, as ``pg_basebackup -R`` writes them.

    pg_rewind copied the source's postgresql.auto.conf, whose primary_conninfo
    (if the source was a standby once) names this very site: it is replaced.
    """
    auto = db.data_dir / "postgresql.auto.conf"
    write_primary_conninfo(db.data_dir, db.replication_conninfo(primary))
    signal_file = db.data_dir / "standby.signal"
    signal_file.touch()
    shutil.copymode(auto, signal_file)
    data_dir_owner = db.data_dir.stat()
    os.chown(signal_file, data_dir_owner.st_uid, data_dir_owner.st_gid)


