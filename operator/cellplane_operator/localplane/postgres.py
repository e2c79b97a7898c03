"""PostgreSQL 15 instances on loopback: a primary and streaming standbys.

Clusters are made with data checksums, so pg_rewind can later turn a fenced old
primary into a standby of the new one. Postgres refuses to run as root, so when
the launcher is root (as CI is) every server program runs as the ``postgres``
OS user and owns its data directory.

No connection is trusted (``localplane.pgauth``): the superuser has a password
from initdb on, standbys stream as the replication role, and every password
reaches libpq through a passfile.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.pgauth import (
    REPLICATION_ROLE,
    SCRAM_HBA,
    new_password,
    scram_verifier,
    write_passfile,
)
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import ManagedProcess, run_checked

__all__ = ["PostgresInstance", "postgres_os_user", "init_primary_cluster", "base_backup",
           "postgres_argv", "SUPERUSER"]

SUPERUSER = "postgres"

_CONF = """
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
wal_keep_size = '256MB'
# fsync protects against an OS crash, which local tests never have; killing
# the server process (SIGKILL) loses nothing with fsync off.
fsync = {fsync}
shared_buffers = '32MB'
max_connections = 100
logging_collector = off
log_line_prefix = '%m [%p] '
"""


def postgres_os_user() -> str | None:
    """The OS user that runs the server programs: ``postgres`` when we are root."""
    if explicit := os.environ.get("CELLPLANE_PG_OS_USER"):
        return explicit
    return "postgres" if os.geteuid() == 0 else None


class PostgresInstance:
    def __init__(
        self,
        binaries: Binaries,
        base_dir: Path,
        name: str,
        *,
        durable: bool = False,
    ) -> None:
        self.name = name
        self._binaries = binaries
        self.data_dir = base_dir / f"pg-{name}"
        self.log = base_dir / "logs" / f"postgres-{name}.log"
        self.port = free_port()
        self._durable = durable
        self._os_user = postgres_os_user()
        self.process: ManagedProcess | None = None
        self.passwords = {SUPERUSER: new_password(), REPLICATION_ROLE: new_password()}
        """The cluster's: a standby's are its primary's, since roles replicate."""
        self.passfile = base_dir / f"pg-{name}.pgpass"
        """The superuser's password for this process's connections (mode 0600)."""
        self._server_passfile = base_dir / f"pg-{name}.server.pgpass"
        """The replication role's, for the Postgres OS user's base backup and WAL receiver."""

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str, *, user: str = SUPERUSER,
                passfile: Path | None = None) -> str:
        return (f"host={LOOPBACK} port={self.port} user={user} dbname={dbname} "
                f"passfile={passfile or self.passfile}")

    def init_primary(self) -> None:
        """A new cluster with data checksums, configured for streaming replication."""
        write_passfile(self.passfile, {SUPERUSER: self.passwords[SUPERUSER]})
        init_primary_cluster(self._binaries, self.data_dir, log=self.log, os_user=self._os_user,
                             durable=self._durable, superuser_password=self.passwords[SUPERUSER])

    def init_standby_of(self, primary: PostgresInstance) -> None:
        """A base backup of ``primary`` that streams from it (``pg_basebackup -R``), as the
        replication role (made on the primary first)."""
        primary.execute(primary.replication_role_sql())
        self.passwords = dict(primary.passwords)
        write_passfile(self.passfile, {SUPERUSER: self.passwords[SUPERUSER]})
        server_passfile = write_passfile(
            self._server_passfile, {REPLICATION_ROLE: self.passwords[REPLICATION_ROLE]},
            owner=self._os_user)
        base_backup(self._binaries, self.data_dir, log=self.log, os_user=self._os_user,
                    host=LOOPBACK, port=primary.port, label=f"cellplane-{self.name}",
                    passfile=server_passfile)

    def replication_role_sql(self) -> str:
        """Creates the replication role with its password, or sets the password."""
        verifier = scram_verifier(self.passwords[REPLICATION_ROLE])
        return (f"DO $$ BEGIN "
                f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{REPLICATION_ROLE}') THEN "
                f"CREATE ROLE {REPLICATION_ROLE} LOGIN REPLICATION; END IF; "
                f"ALTER ROLE {REPLICATION_ROLE} LOGIN REPLICATION PASSWORD '{verifier}'; END $$")

    def start(self, *, timeout: float = 60) -> None:
        argv = postgres_argv(self._binaries, self.data_dir, self.port)
        self.process = ManagedProcess(f"postgres-{self.name}", argv, log=self.log,
                                      user=self._os_user)
        self.process.start()
        self.process.wait_until(self.accepts_connections, timeout=timeout,
                                what=f"connections on port {self.port}")

    def accepts_connections(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def execute(self, sql: str, params: tuple[Any, ...] = (), *, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """One autocommitted statement; returns its rows (empty for a command)."""
        with psycopg.connect(self.dsn_for(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql.encode(), params)
            return list(cursor.fetchall()) if cursor.description else []

    def in_recovery(self) -> bool:
        return bool(self.execute("SELECT pg_is_in_recovery()")[0][0])

    def promote(self, *, wait_seconds: int = 60) -> None:
        """Ends recovery: the standby becomes a primary that accepts writes."""
        promoted = self.execute("SELECT pg_promote(true, %s)", (wait_seconds,))[0][0]
        if not promoted:
            raise RuntimeError(f"postgres-{self.name} did not finish promotion in {wait_seconds}s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=30)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def remove(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


# The steps below are functions, not only methods, because the local site
# driver (sites/) keeps its own long-lived Postgres per site with the same
# configuration but its own start/adopt/stop path.

def init_primary_cluster(binaries: Binaries, data_dir: Path, *, log: Path, os_user: str | None,
                         superuser_password: str, durable: bool = False,
                         hba: str = SCRAM_HBA) -> None:
    """``initdb --data-checksums`` into a fresh ``data_dir``: replication-ready, the
    superuser's password set from the start (no moment of trust), SCRAM on loopback (or
    whatever SCRAM-only ``hba`` the caller gives: ``pgauth.scram_hba``)."""
    _prepare_dir(data_dir, log, os_user)
    # initdb (the Postgres OS user) reads the password from a file, never its argv; the
    # file is beside the data dir (initdb wants that empty) and gone once it ran.
    pwfile = write_passfile(data_dir.parent / f".{data_dir.name}.pwfile", {}, owner=os_user)
    pwfile.write_text(superuser_password + "\n")
    try:
        run_checked(
            [binaries.pg("initdb"), "-D", str(data_dir), "--data-checksums",
             "-U", SUPERUSER, "--auth=scram-sha-256", f"--pwfile={pwfile}",
             "--encoding=UTF8", "--locale=C"],
            log=log, user=os_user,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    (data_dir / "pg_hba.conf").write_text(hba)
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write(_CONF.format(fsync="on" if durable else "off"))


def base_backup(binaries: Binaries, data_dir: Path, *, log: Path, os_user: str | None,
                host: str, port: int, label: str, passfile: Path) -> None:
    """``pg_basebackup -R`` of the primary at ``host:port`` into a fresh ``data_dir``, as the
    replication role whose password ``passfile`` holds (readable by ``os_user``); the
    ``primary_conninfo`` it writes names that passfile too."""
    _prepare_dir(data_dir, log, os_user)
    conninfo = f"host={host} port={port} user={REPLICATION_ROLE} passfile={passfile}"
    run_checked(
        [binaries.pg("pg_basebackup"), "-d", conninfo, "-D", str(data_dir), "-R",
         "-X", "stream", "--checkpoint=fast", f"--label={label}"],
        log=log, user=os_user,
    )


def postgres_argv(binaries: Binaries, data_dir: Path, port: int,
                  settings: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The server's command line. The port is an argument, so a base backup can keep the
    primary's postgresql.conf as it is; so are ``settings`` (name, value), which override
    that file (a site agent's listen addresses and socket directory)."""
    argv = [binaries.pg("postgres"), "-D", str(data_dir), "-c", f"port={port}"]
    for name, value in settings:
        argv += ["-c", f"{name}={value}"]
    return argv


def _prepare_dir(data_dir: Path, log: Path, os_user: str | None) -> None:
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True, mode=0o700)
    log.parent.mkdir(parents=True, exist_ok=True)
    if os_user is not None:
        entry = pwd.getpwnam(os_user)
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
