"""A site's own Postgres: created once, started detached, adopted by the next operator.

The cluster is configured exactly as the local control plane's (initdb with
data checksums, replication-ready, SCRAM passwords on loopback:
``localplane.postgres``), but its life is the site's, not a Python object's:
the postmaster runs in its own session and is found again through
``postmaster.pid`` in the data directory, which Postgres itself keeps.

Passwords are the cell's (``sites/credentials.py``), kept in the site's
``secrets/``; every connection names a passfile. A cluster made before
passwords existed (it trusted loopback) is upgraded in place the first time
this code meets it (``secure_primary``, ``secure_standby``).

Where the server listens and whom it admits is a ``SiteNetwork``: by default the
local driver's (loopback, no unix socket, the private socket for reading); a
site agent in a Pod listens on every address, admits every address with SCRAM
only, names its database Service in endpoints and opens a fenced server for
reading on a TCP port of its own that admits the superuser only.

Every method blocks; the driver calls them in threads.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cellplane_cells.roles import PROCESS_ROLES
from cellplane_operator.errors import CellplaneError, SiteError
from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.pgauth import (
    LOOPBACK_NETWORKS,
    REPLICATION_ROLE,
    scram_hba,
    scram_verifier,
    verifier_matches,
    write_passfile,
)
from cellplane_operator.localplane.ports import LOOPBACK
from cellplane_operator.localplane.postgres import (
    SUPERUSER,
    base_backup,
    init_primary_cluster,
    postgres_argv,
)
from cellplane_operator.localplane.process import tail, wait_for
from cellplane_operator.sites.base import DatabaseEndpoint
from cellplane_operator.sites.credentials import DatabaseCredentials, write_private
from cellplane_operator.sites.processes import ProcessRecord, spawn, start_time, stop_processes
from cellplane_operator.sites.state import SiteLayout

__all__ = ["SiteDatabase", "SiteNetwork", "DatabaseHealth", "CELL_DBNAME", "running_postmaster", "stop_postgres",
           "parse_control_data", "write_primary_conninfo"]

CELL_DBNAME = "cellplane"
"""The database that holds a cell's tables, on every site."""

# One statement, so the readings are of one moment. Lag is 0 when every
# received byte is replayed (an idle primary writes nothing to replay, and
# now() - last replay timestamp would grow forever). Lag and locations are NULL
# on a primary: a promoted one keeps reporting where its recovery ended.
HEALTH_SQL = b"""
SELECT pg_is_in_recovery(),
       (SELECT status FROM pg_stat_wal_receiver LIMIT 1),
       CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())
       END,
       CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END,
       CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()::text END
"""
DATABASE_EXISTS_SQL = b"SELECT 1 FROM pg_database WHERE datname = %s"
VERIFIERS_SQL = b"SELECT rolname, rolpassword, rolcanlogin FROM pg_authid"
RELOAD_SQL = b"SELECT pg_reload_conf()"
# The hba file of a site opened for reading: it listens on a private socket only,
# and whoever can enter that directory is this operator (or root).
READING_HBA = """\
# cellplane: an old primary opened for reading over its private socket; no TCP listener.
local   all             all                             trust
"""


def reading_tcp_hba(networks: tuple[str, ...]) -> str:
    """A server opened for reading on a TCP port as well: the private socket as always, and
    over TCP the superuser only, with SCRAM (no cell role, no replication)."""
    return READING_HBA + "".join(
        f"host    all             {SUPERUSER:<15} {net:<15} scram-sha-256\n"
        for net in networks)


SOCKET_PATH_MAX = 107
"""sun_path holds 108 bytes, the last one a NUL."""

START_TIMEOUT = 60.0
STOP_GRACE = 30.0
# After a postmaster is killed, its backends notice within moments and exit;
# until they have, the shared memory is "still in use" and a new postmaster
# refuses to start. Such a refusal is retried for this long.
SHARED_MEMORY_RETRY_SECONDS = 15.0


@dataclass(frozen=True)
class SiteNetwork:
    """Where a site's Postgres listens, whom it admits, and the host its endpoints name.

    The default is the local driver's, exactly: loopback only, no unix socket, and a
    fenced server opened for reading over a private socket only. The site's own
    connections (the driver's, the agent's) always go over loopback, so
    ``listen_addresses`` must include it (``*`` does).
    """

    listen_addresses: str = LOOPBACK
    """The server's ``listen_addresses``: ``*`` in a Pod."""
    advertised_host: str = LOOPBACK
    """The host that endpoints and the cell processes' conninfos name: in a Pod, a DNS name
    of the site's database."""
    client_networks: tuple[str, ...] = LOOPBACK_NETWORKS
    """The CIDRs pg_hba.conf admits, with SCRAM only (``pgauth.scram_hba``)."""
    socket_dir: Path | None = None
    """``unix_socket_directories``; None: no socket (the local driver's)."""
    reading_port: int | None = None
    """None: a fenced server opened for reading listens on its private socket only. A port:
    also on TCP there (``listen_addresses``), admitting the superuser only, with SCRAM: the
    operator of a Pod's site is on another machine."""

    @property
    def is_local(self) -> bool:
        """The local driver's network: its command lines stay exactly what they were."""
        return self == SiteNetwork()

    def server_settings(self) -> list[tuple[str, str]]:
        """``-c`` settings of the normal server; none for the local driver, whose
        postgresql.conf already says loopback and no socket."""
        if self.is_local:
            return []
        sockets = "" if self.socket_dir is None else f'"{self.socket_dir}"'
        return [("listen_addresses", self.listen_addresses),
                ("unix_socket_directories", sockets)]

    @property
    def hba(self) -> str:
        return scram_hba(self.client_networks)


LOCAL_NETWORK = SiteNetwork()


@dataclass(frozen=True)
class DatabaseHealth:
    in_recovery: bool
    streaming: bool
    replay_lag_seconds: float | None
    replay_lsn: str | None
    receive_lsn: str | None


class SiteDatabase:
    def __init__(self, binaries: Binaries, layout: SiteLayout, port: int, *,
                 os_user: str | None, network: SiteNetwork = LOCAL_NETWORK) -> None:
        self._binaries = binaries
        self._layout = layout
        self.port = port
        self._os_user = os_user
        self.network = network

    @property
    def data_dir(self) -> Path:
        return self._layout.data_dir

    @property
    def log(self) -> Path:
        return self._layout.log("postgres")

    @property
    def endpoint(self) -> DatabaseEndpoint:
        """The operator's way in: the superuser, its password in the site's passfile."""
        return DatabaseEndpoint(host=self.network.advertised_host, port=self.port,
                                dbname=CELL_DBNAME, user=SUPERUSER,
                                passfile=str(self._layout.passfile(SUPERUSER)))

    def dsn(self, dbname: str = "postgres") -> str:
        # The site's own connections: over loopback, wherever the server is advertised.
        return make_conninfo(host=LOOPBACK, port=self.port, user=SUPERUSER, dbname=dbname,
                             passfile=str(self._layout.passfile(SUPERUSER)))

    def role_conninfo(self, role: str) -> str:
        """A cell process's conninfo: its own role, its own passfile (no password in it)."""
        return make_conninfo(host=self.network.advertised_host, port=self.port, user=role,
                             dbname=CELL_DBNAME,
                             passfile=str(self._layout.passfile(role)))

    def replication_conninfo(self, primary: DatabaseEndpoint) -> str:
        """``primary_conninfo``: the replication role, with the Postgres OS user's passfile."""
        return make_conninfo(host=primary.host, port=primary.port, user=REPLICATION_ROLE,
                             passfile=str(self._layout.server_passfile),
                             application_name=self._layout.root.name)

    def rewind_source(self, primary: DatabaseEndpoint) -> str:
        """pg_rewind's ``--source-server``: it reads files through SQL, as the superuser."""
        return make_conninfo(host=primary.host, port=primary.port, user=SUPERUSER,
                             dbname="postgres", passfile=str(self._layout.server_passfile))

    # -- credentials ---------------------------------------------------------------

    def credentials(self) -> DatabaseCredentials | None:
        try:
            return DatabaseCredentials.from_json(self._layout.credentials_file.read_text())
        except FileNotFoundError:
            return None

    def install_credentials(self, credentials: DatabaseCredentials) -> None:
        """The site's copy of the cell's passwords and the passfiles made of them."""
        if self.credentials() != credentials:
            write_private(self._layout.credentials_file, credentials.to_json())
        for role in (SUPERUSER, *PROCESS_ROLES):
            write_passfile(self._layout.passfile(role), {role: credentials.password(role)})
        # The Postgres OS user's: replication, and pg_rewind's superuser session. That user
        # owns the data directory, and so every row, already: this gives it nothing new.
        write_passfile(self._layout.server_passfile,
                       {role: credentials.password(role) for role in (SUPERUSER, REPLICATION_ROLE)},
                       owner=self._os_user)

    def _required_credentials(self) -> DatabaseCredentials:
        found = self.credentials()
        if found is None:
            raise SiteError(f"{self._layout.root.name} has no database credentials "
                            f"({self._layout.credentials_file} is missing)")
        return found

    def secure_primary(self) -> None:
        """A cluster that still trusts loopback (made before passwords) gets the superuser's
        password first, then the SCRAM pg_hba.conf, reloaded: nobody is locked out, and
        from then on nobody gets in without a password."""
        if not self._trusts():
            return
        credentials = self._required_credentials()
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            _set_password(conn, SUPERUSER, credentials.password(SUPERUSER), create=False)
            self.write_scram_hba()
            conn.execute(RELOAD_SQL)

    def set_role_passwords(self) -> None:
        """Every role's password on the primary (its standbys get them by replication):
        only where the stored verifier does not already accept it. Run after the
        migrations, which create the cell processes' roles."""
        credentials = self._required_credentials()
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            stored = {row[0]: (row[1], row[2]) for row in conn.execute(VERIFIERS_SQL)}
            for role in (SUPERUSER, REPLICATION_ROLE, *PROCESS_ROLES):
                verifier, can_login = stored.get(role, (None, False))
                if not can_login or not verifier_matches(verifier, credentials.password(role)):
                    _set_password(conn, role, credentials.password(role),
                                  create=role not in stored)

    def secure_standby(self, primary: DatabaseEndpoint) -> bool:
        """A standby made before passwords (it trusts loopback, or streams as the superuser
        without a password) moves to the replication role and SCRAM, once the primary's
        passwords have reached it by replication; until then it is left as it is (the
        primary's operator sets them first). True when it is secured."""
        auto = self.data_dir / "postgresql.auto.conf"
        wanted = self.replication_conninfo(primary)
        conninfo_current = _conninfo_line(wanted) in auto.read_text().splitlines()
        if not self._trusts() and conninfo_current:
            return True
        credentials = self._required_credentials()
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            stored = {row[0]: row[1] for row in conn.execute(VERIFIERS_SQL)}
            if not all(verifier_matches(stored.get(role), credentials.password(role))
                       for role in (SUPERUSER, REPLICATION_ROLE)):
                return False
            if not conninfo_current:
                write_primary_conninfo(self.data_dir, wanted)
            self.write_scram_hba()
            conn.execute(RELOAD_SQL)
        return True

    def _trusts(self) -> bool:
        """Does the cluster's pg_hba.conf still let anyone in without a password?"""
        try:
            text = (self.data_dir / "pg_hba.conf").read_text()
        except FileNotFoundError:
            return False
        return any(line.split()[-1] == "trust" for line in text.splitlines()
                   if line.strip() and not line.lstrip().startswith("#"))

    def write_scram_hba(self) -> None:
        """The SCRAM pg_hba.conf, written in place (the file keeps its owner)."""
        (self.data_dir / "pg_hba.conf").write_text(self.network.hba)

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def running_postmaster(self) -> ProcessRecord | None:
        return running_postmaster(self._layout)

    @property
    def reading_port(self) -> int:
        """The port of the server ``start_for_reading`` starts (its socket's name too)."""
        return self.network.reading_port or self.port

    def reading_dsn(self, dbname: str = "postgres") -> str:
        """Over the private socket of ``start_for_reading``."""
        return make_conninfo(host=str(self._layout.reading_dir), port=self.reading_port,
                             user=SUPERUSER, dbname=dbname)

    def accepts_connections(self, dsn: str | None = None) -> bool:
        try:
            with psycopg.connect(dsn or self.dsn(), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def init_primary(self) -> None:
        self._check_reachable()
        password = self._required_credentials().password(SUPERUSER)
        try:
            init_primary_cluster(self._binaries, self.data_dir, log=self.log,
                                 os_user=self._os_user, superuser_password=password,
                                 hba=self.network.hba)
        except CellplaneError as error:
            raise SiteError(f"initdb for {self._layout.root.name} failed: {error}") from error

    def init_standby(self, primary: DatabaseEndpoint) -> None:
        self._check_reachable()
        try:
            base_backup(self._binaries, self.data_dir, log=self.log, os_user=self._os_user,
                        host=primary.host, port=primary.port,
                        label=f"cellplane-{self._layout.root.name}",
                        passfile=self._layout.server_passfile)
            # The same primary_conninfo as every later re-point writes (secure_standby
            # compares it).
            write_primary_conninfo(self.data_dir, self.replication_conninfo(primary))
        except CellplaneError as error:
            raise SiteError(f"pg_basebackup for {self._layout.root.name} from "
                            f"{primary.host}:{primary.port} failed: {error}") from error

    def start(self, on_spawn: Callable[[ProcessRecord], None]) -> ProcessRecord:
        """Starts the postmaster detached and waits until it accepts connections.

        ``on_spawn`` records the process before the wait, so a start that times
        out still leaves a PID behind for the next stop.
        """
        argv = postgres_argv(self._binaries, self.data_dir, self.port,
                             self.network.server_settings())
        return self._start(argv, on_spawn, ready=self.wait_ready)

    def start_for_reading(self, on_spawn: Callable[[ProcessRecord], None]) -> ProcessRecord:
        """Starts the postmaster read-only, reachable over a private unix socket and nothing else.

        Every setting is on the command line, so the data directory stays as
        it is (a fenced site's pg_hba.conf keeps rejecting whatever starts it
        normally). Read-only by default only: the private socket is the fence.
        """
        hba = self._prepare_reading_dir()
        # With a reading port, TCP there too (pg_hba: the superuser, SCRAM) and nothing on the
        # site's own port, which its Service and its standbys use.
        listen = "" if self.network.reading_port is None else self.network.listen_addresses
        argv = [*postgres_argv(self._binaries, self.data_dir, self.reading_port),
                "-c", f"listen_addresses={listen}",
                "-c", f'unix_socket_directories="{self._layout.reading_dir}"',
                "-c", f"hba_file={hba}",
                "-c", "default_transaction_read_only=on"]
        return self._start(argv, on_spawn, ready=lambda record: self.wait_ready(
            record, dsn=self.reading_dsn()))

    def is_open_for_reading(self, record: ProcessRecord) -> bool:
        """The postmaster is one that ``start_for_reading`` started (its own command line says)."""
        marker = f"hba_file={self._layout.reading_dir / 'pg_hba.conf'}".encode()
        try:
            return marker in Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            return False

    def control_data(self) -> dict[str, str]:
        """What pg_controldata reports, by label (in the C locale, so the labels are English)."""
        result = subprocess.run(
            [self._binaries.pg("pg_controldata"), "-D", str(self.data_dir)],
            capture_output=True, text=True, user=self._os_user, cwd="/", check=False,
            env={**os.environ, "LC_ALL": "C"}, stdin=subprocess.DEVNULL, timeout=60)
        if result.returncode != 0:
            raise SiteError(f"pg_controldata of {self._layout.root.name} exited with "
                            f"{result.returncode}: {result.stderr.strip()}")
        return parse_control_data(result.stdout)

    def _start(self, argv: list[str], on_spawn: Callable[[ProcessRecord], None], *,
               ready: Callable[[ProcessRecord], None]) -> ProcessRecord:
        self._drop_zombie_lock()
        self._restore_private_modes()
        deadline = time.monotonic() + SHARED_MEMORY_RETRY_SECONDS
        while True:
            offset = self.log.stat().st_size if self.log.exists() else 0
            pid, started = spawn(argv, log=self.log, user=self._os_user)
            record = ProcessRecord("postgres", pid, started)
            on_spawn(record)
            try:
                ready(record)
                return record
            except SiteError:
                said = self.log.read_bytes()[offset:]
                if b"is still in use" not in said or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _restore_private_modes(self) -> None:
        """Postgres refuses a data directory its group may write, and libpq ignores a
        passfile others may read. A volume mounted again with an fsGroup (the kubelet
        makes it group-writable: seen when an operator pod was replaced on its claim) or
        copied loses both modes; they are put back before every start."""
        if self.data_dir.is_dir():
            self.data_dir.chmod(0o700)
        secrets = self._layout.secrets_dir
        if secrets.is_dir():
            secrets.chmod(0o700)
            for path in secrets.iterdir():
                if path.is_file():
                    path.chmod(0o600)
        if self._layout.server_passfile.is_file():
            self._layout.server_passfile.chmod(0o600)

    def wait_ready(self, record: ProcessRecord, timeout: float = START_TIMEOUT, *,
                   dsn: str | None = None) -> None:
        def alive() -> None:
            if not record.running:
                raise SiteError(f"postgres of {self._layout.root.name} exited; log {self.log}:\n"
                                f"{tail(self.log)}")
        try:
            wait_for(lambda: self.accepts_connections(dsn), timeout=timeout, interval=0.1,
                     alive=alive,
                     what=f"postgres of {self._layout.root.name} at {dsn or self.dsn()}")
        except CellplaneError as error:
            if isinstance(error, SiteError):
                raise
            raise SiteError(f"{error}; log {self.log}:\n{tail(self.log)}") from error

    def stop(self, record: ProcessRecord | None) -> list[int]:
        return stop_postgres(self._layout, record)

    def ensure_cell_database(self) -> None:
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            if conn.execute(DATABASE_EXISTS_SQL, (CELL_DBNAME,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{CELL_DBNAME}"'.encode())

    def health(self) -> DatabaseHealth | None:
        try:
            with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=2) as conn:
                row = conn.execute(HEALTH_SQL).fetchone()
        except psycopg.OperationalError:
            return None
        assert row is not None
        return DatabaseHealth(in_recovery=bool(row[0]), streaming=row[1] == "streaming",
                              replay_lag_seconds=None if row[2] is None else float(row[2]),
                              replay_lsn=row[3], receive_lsn=row[4])

    def _drop_zombie_lock(self) -> None:
        """Removes ``postmaster.pid`` when it names a dead postmaster that is still a zombie.

        Postgres removes a stale lock itself when its PID is gone, but it probes
        with kill(pid, 0), which a zombie answers. A zombie that is not our child
        (its parent is a PID 1 that never reaps) would block every restart.
        Postgres's shared-memory check still refuses to start beside live
        backends of the old postmaster, so removing the file risks nothing.
        """
        pid = _lock_pid(self._layout)
        if pid is not None and start_time(pid) is None and Path(f"/proc/{pid}").exists():
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)

    def _prepare_reading_dir(self) -> Path:
        """The private socket directory, mode 0700 and the Postgres OS user's; its hba file."""
        directory = self._layout.reading_dir
        socket = directory / f".s.PGSQL.{self.reading_port}"
        if len(str(socket).encode()) > SOCKET_PATH_MAX:
            raise SiteError(f"the socket path {socket} is longer than the {SOCKET_PATH_MAX} "
                            "bytes a unix socket may have: use a shorter state dir")
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)
        hba = directory / "pg_hba.conf"
        hba.write_text(READING_HBA if self.network.reading_port is None
                       else reading_tcp_hba(self.network.client_networks))
        if self._os_user is not None:
            owner = pwd.getpwnam(self._os_user)
            for path in (directory, hba):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        return hba

    def _check_reachable(self) -> None:
        """The Postgres OS user must be able to walk to the data directory; say so plainly."""
        self._layout.root.mkdir(parents=True, exist_ok=True)
        if self._os_user is None:
            return
        probe = subprocess.run(["test", "-x", str(self._layout.root)], user=self._os_user,
                               check=False, stdin=subprocess.DEVNULL)
        if probe.returncode != 0:
            raise SiteError(
                f"the {self._os_user} OS user (which runs Postgres) cannot enter "
                f"{self._layout.root}: every parent directory needs o+x "
                "(pytest's tmp_path, for one, is private to its user)")


def write_primary_conninfo(data_dir: Path, conninfo: str) -> None:
    """``primary_conninfo`` in postgresql.auto.conf, replacing any other (as ``pg_basebackup -R``
    writes it); the file keeps its owner."""
    auto = data_dir / "postgresql.auto.conf"
    kept = [line for line in auto.read_text().splitlines()
            if not line.strip().startswith("primary_conninfo")]
    kept.append(_conninfo_line(conninfo))
    auto.write_text("\n".join(kept) + "\n")


def _conninfo_line(conninfo: str) -> str:
    quoted = conninfo.replace("'", "''")
    return f"primary_conninfo = '{quoted}'"


def _set_password(conn: psycopg.Connection[Any], role: str, password: str, *,
                  create: bool) -> None:
    """The role can log in with ``password``; the server is sent its SCRAM verifier, never
    the password, so no statement log holds it."""
    verb = "CREATE" if create else "ALTER"
    conn.execute(sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(
        sql.SQL(verb), sql.Identifier(role), sql.Literal(scram_verifier(password))))
    if role == REPLICATION_ROLE:
        conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(role)))


def running_postmaster(layout: SiteLayout) -> ProcessRecord | None:
    """The postmaster that ``postmaster.pid`` names, if that process runs on this data dir.

    The command line is checked as well as the PID: a stale lock file may name
    a PID that now belongs to another program. (The postmaster keeps its own
    command line; only its children retitle themselves.)
    """
    pid = _lock_pid(layout)
    if pid is None:
        return None
    started = start_time(pid)
    if started is None:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return None
    if str(layout.data_dir).encode() not in argv:
        return None
    return ProcessRecord("postgres", pid, started)


def stop_postgres(layout: SiteLayout, record: ProcessRecord | None) -> list[int]:
    """Fast shutdown (SIGINT: clients are disconnected; SIGTERM would wait for them).

    Stops the recorded postmaster and the one ``postmaster.pid`` names, if they differ.
    """
    found = {(r.pid, r.start_time) for r in (record, running_postmaster(layout)) if r is not None}
    return stop_processes([(pid, started, signal.SIGINT) for pid, started in found],
                          grace=STOP_GRACE)


def parse_control_data(report: str) -> dict[str, str]:
    """``Latest checkpoint location:   0/3000028`` lines as a mapping of label to value."""
    fields = (line.partition(":") for line in report.splitlines())
    return {label.strip(): value.strip() for label, colon, value in fields if colon}


def _lock_pid(layout: SiteLayout) -> int | None:
    try:
        first = (layout.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None
    return int(first) if first.strip().isdigit() else None
