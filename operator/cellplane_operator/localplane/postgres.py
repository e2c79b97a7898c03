"""PostgreSQL 15 instances on loopback: a primary and streaming standbys.

Clusters are made with data checksums, so pg_rewind can later turn a fenced old
primary into a standby of the new one. Postgres refuses to run as root, so when
the launcher is root (as CI is) every server program runs as the ``postgres``
OS user and owns its data directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path
from typing import Any

import psycopg

from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import ManagedProcess, run_checked

__all__ = ["PostgresInstance", "postgres_os_user", "init_primary_cluster", "base_backup",
           "postgres_argv"]

SUPERUSER = "postgres"

# Every instance listens on loopback only and trusts loopback: these clusters
# hold test data and live for one test or one demo.
_HBA = """\
host    all             all             127.0.0.1/32    trust
host    replication     all             127.0.0.1/32    trust
"""

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

    @property
    def dsn(self) -> str:
        return f"host={LOOPBACK} port={self.port} user={SUPERUSER} dbname=postgres"

    def dsn_for(self, dbname: str) -> str:
        return f"host={LOOPBACK} port={self.port} user={SUPERUSER} dbname={dbname}"

    def init_primary(self) -> None:
        """A new cluster with data checksums, configured for streaming replication."""
        init_primary_cluster(self._binaries, self.data_dir, log=self.log, os_user=self._os_user,
                             durable=self._durable)

    def init_standby_of(self, primary: PostgresInstance) -> None:
        """A base backup of ``primary`` that streams from it (``pg_basebackup -R``)."""
        base_backup(self._binaries, self.data_dir, log=self.log, os_user=self._os_user,
                    host=LOOPBACK, port=primary.port, label=f"cellplane-{self.name}")

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
                         durable: bool = False) -> None:
    """``initdb --data-checksums`` into a fresh ``data_dir``: replication-ready, trusts loopback."""
    _prepare_dir(data_dir, log, os_user)
    run_checked(
        [binaries.pg("initdb"), "-D", str(data_dir), "--data-checksums",
         "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--locale=C"],
        log=log, user=os_user,
    )
    (data_dir / "pg_hba.conf").write_text(_HBA)
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write(_CONF.format(fsync="on" if durable else "off"))


def base_backup(binaries: Binaries, data_dir: Path, *, log: Path, os_user: str | None,
                host: str, port: int, label: str) -> None:
    """``pg_basebackup -R`` of the primary at ``host:port`` into a fresh ``data_dir``."""
    _prepare_dir(data_dir, log, os_user)
    run_checked(
        [binaries.pg("pg_basebackup"), "-h", host, "-p", str(port),
         "-U", SUPERUSER, "-D", str(data_dir), "-R", "-X", "stream",
         "--checkpoint=fast", f"--label={label}"],
        log=log, user=os_user,
    )


def postgres_argv(binaries: Binaries, data_dir: Path, port: int) -> list[str]:
    """The server's command line. The port is an argument, so a base backup can keep the
    primary's postgresql.conf as it is."""
    return [binaries.pg("postgres"), "-D", str(data_dir), "-c", f"port={port}"]


def _prepare_dir(data_dir: Path, log: Path, os_user: str | None) -> None:
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True, mode=0o700)
    log.parent.mkdir(parents=True, exist_ok=True)
    if os_user is not None:
        entry = pwd.getpwnam(os_user)
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
