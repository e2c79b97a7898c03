"""The site agent: one site's Postgres in its own Pod, managed on the operator's request.

The agent is the database container's PID 1. It holds the local driver's
database half (``LocalSiteDriver``, ``SiteDatabase``, ``sites/failover.py``) for
exactly one site, with the Pod's network (``SiteNetwork``): Postgres listens on
every address on a fixed port, admits every address with SCRAM only, its
endpoints name the site's database DNS name, and a fenced server opened for
reading listens on a port of its own that admits the superuser only.

It never starts Postgres on its own. After a restart (the Pod's, on a node that
returns after a takeover) its record may say ``primary`` while another region
took over: only the operator, once it has compared the site's role with etcd's
active record (``domain/failover.site_role``), says what the site becomes. So nothing here
runs at start-up; Postgres starts only when an operation (or a status with
``restart``) asks for it.

Operations are serialised; each blocks in a thread (the driver's), so the HTTP
loop keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import secrets
from dataclasses import dataclass
from pathlib import Path

from cellplane_operator.errors import SiteError
from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.postgres import SUPERUSER, postgres_os_user
from cellplane_operator.sites.agent_wire import AgentEndpoint, AgentStatus
from cellplane_operator.sites.base import DatabaseEndpoint, SiteKey
from cellplane_operator.sites.credentials import ROLES, DatabaseCredentials
from cellplane_operator.sites.database import CELL_DBNAME, SiteNetwork
from cellplane_operator.sites.local import LocalSiteDriver, stop_site
from cellplane_operator.sites.state import SiteLayout

__all__ = ["AgentConfig", "SiteAgent", "DirectoryCredentials", "EVERY_ADDRESS"]

log = logging.getLogger(__name__)

EVERY_ADDRESS = ("0.0.0.0/0", "::/0")
"""Whom a Pod's Postgres admits (with SCRAM): other regions' standbys and operators come from
anywhere in the pod network, and the token-less path is a password anyway."""
RECORD_FILE = "agent.json"
"""Beside the site's ``site.json``: the last epoch an operator made this site primary under."""


@dataclass(frozen=True)
class AgentConfig:
    """``cellplane site agent``'s flags, read once at the entry point."""

    site: SiteKey
    """The one site this agent runs."""
    state_dir: Path
    """The site's volume: the site lives in ``<state_dir>/<cell>@<region>/`` (``pgdata/``,
    ``site.json``, ``agent.json``, ``secrets/``)."""
    socket_dir: Path
    """Postgres's unix socket directory (for ``pg_isready``); writable in the Pod."""
    postgres_bin: Path
    """PostgreSQL's server programs."""
    postgres_port: int
    """The site's Postgres port, the same on every site (the Service's)."""
    credentials_dir: Path
    """The cell's database Secret as files: one per role, named after it, holding its password."""
    advertise_host: str
    """The host the endpoints name: the site's database DNS name."""
    reading_port: int
    """Where a fenced or demoted server opened for reading listens (the superuser only)."""
    postgres_listen: str = "*"
    """Postgres's ``listen_addresses`` (must include loopback: the agent connects there)."""


class DirectoryCredentials:
    """The cell's passwords from a mounted Secret: one file per role (its name), holding the
    role's password. The files may be group-readable (a Secret volume under an fsGroup):
    the site copies them into its own ``secrets/`` with private modes before libpq sees any."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    async def cell_credentials(self, cell: str) -> DatabaseCredentials:
        return await asyncio.to_thread(self._read, cell)

    def _read(self, cell: str) -> DatabaseCredentials:
        passwords: dict[str, str] = {}
        for role in ROLES:
            try:
                password = (self._directory / role).read_text().rstrip("\r\n")
            except OSError as error:
                raise SiteError(f"cannot read the database password of {role} for {cell} "
                                f"from {self._directory}: {error}") from error
            if not password:
                raise SiteError(f"{self._directory / role} is empty: the cell's database "
                                f"Secret has no password for {role}")
            passwords[role] = password
        return DatabaseCredentials(passwords)


class SiteAgent:
    """The database operations of one site (``SiteDriver``'s database half), with a record
    of the last primary epoch. Called by the HTTP endpoint (``agent_http.py``)."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._site = config.site
        # The agent runs PostgreSQL's programs only; the Go-built ones are never looked for.
        unused = Path("/nonexistent")
        binaries = Binaries(kube_apiserver=unused, kubectl=unused, etcd=unused,
                            postgres_bin=config.postgres_bin)
        binaries.check(postgres_only=True)
        self._network = SiteNetwork(
            listen_addresses=config.postgres_listen, advertised_host=config.advertise_host,
            client_networks=EVERY_ADDRESS, socket_dir=config.socket_dir,
            reading_port=config.reading_port)
        self._driver = LocalSiteDriver(
            binaries, config.state_dir, credentials=DirectoryCredentials(config.credentials_dir),
            advertise_host=config.advertise_host, network=self._network,
            postgres_port=config.postgres_port)
        self._layout = self._driver.layout(self._site)
        self._lock = asyncio.Lock()
        self.boot_id = secrets.token_hex(8)
        """Random per agent process: the client sees a restart as a new one."""

    def prepare(self) -> None:
        """Directories the Postgres OS user writes to (no Postgres is started here)."""
        socket_dir = self._config.socket_dir
        socket_dir.mkdir(parents=True, exist_ok=True)
        if (os_user := postgres_os_user()) is not None:
            entry = pwd.getpwnam(os_user)
            os.chown(socket_dir, entry.pw_uid, entry.pw_gid)

    # -- operations -------------------------------------------------------------------------

    async def status(self, *, restart: bool) -> AgentStatus:
        """The record and Postgres's health; ``restart`` restarts a Postgres that the record
        says should run and died, otherwise no process is touched."""
        if restart:
            async with self._lock:
                health = await self._driver.check(self._site)
        else:
            health = await self._driver.observe(self._site)
        return AgentStatus(
            boot_id=self.boot_id, role=await self._driver.database_role(self._site),
            database_up=health.database_up, in_recovery=health.in_recovery,
            streaming=health.streaming, replay_lag_seconds=health.replay_lag_seconds,
            replay_lsn=health.replay_lsn, receive_lsn=health.receive_lsn,
            restarted=health.restarted, epoch=self._recorded_epoch())

    async def ensure_primary(self, epoch: int | None) -> AgentEndpoint:
        async with self._lock:
            recorded = self._recorded_epoch()
            if epoch is not None and recorded is not None and epoch < recorded:
                raise SiteError(f"{self._site.name} was made primary under epoch {recorded}: "
                                f"epoch {epoch} is older")
            endpoint = await self._driver.ensure_primary_database(self._site)
            if epoch is not None:
                self._record_epoch(epoch)
            return _wire(endpoint)

    async def ensure_standby(self, host: str, port: int) -> AgentEndpoint:
        async with self._lock:
            return _wire(await self._driver.ensure_standby_database(
                self._site, _primary(host, port)))

    async def promote(self) -> AgentEndpoint:
        async with self._lock:
            return _wire(await self._driver.promote_database(self._site))

    async def demote(self) -> str:
        async with self._lock:
            return await self._driver.demote_for_handover(self._site)

    async def fence(self) -> None:
        async with self._lock:
            await self._driver.fence_database(self._site)

    async def open_reading(self) -> AgentEndpoint:
        """The fenced or demoted server, read-only, on the reading port (the superuser only)."""
        async with self._lock:
            await self._driver.open_fenced_for_reading(self._site)
            return AgentEndpoint(host=self._config.advertise_host,
                                 port=self._config.reading_port, dbname=CELL_DBNAME,
                                 user=SUPERUSER)

    async def close_reading(self) -> None:
        async with self._lock:
            await self._driver.close_fenced_reading(self._site)

    async def rebuild(self, host: str, port: int) -> AgentEndpoint:
        async with self._lock:
            return _wire(await self._driver.rebuild_as_standby(self._site, _primary(host, port)))

    async def destroy(self) -> None:
        async with self._lock:
            await self._driver.destroy(self._site)

    def shutdown(self) -> list[int]:
        """Stops the site's Postgres (a fast shutdown); the record stays. Blocks. Only this
        site's directory is looked at: a volume's root holds others (``lost+found``)."""
        return stop_site(self._layout)

    # -- the record ---------------------------------------------------------------------------

    @property
    def _record(self) -> Path:
        return self._layout.root / RECORD_FILE

    def _recorded_epoch(self) -> int | None:
        try:
            raw = json.loads(self._record.read_text())
        except FileNotFoundError:
            return None
        epoch = raw.get("epoch") if isinstance(raw, dict) else None
        return epoch if isinstance(epoch, int) else None

    def _record_epoch(self, epoch: int) -> None:
        """Written to a temporary file and renamed: a crash never leaves half a record."""
        temporary = self._record.with_name(f".{RECORD_FILE}.tmp")
        temporary.write_text(json.dumps({"epoch": epoch}) + "\n")
        os.replace(temporary, self._record)


def _primary(host: str, port: int) -> DatabaseEndpoint:
    return DatabaseEndpoint(host=host, port=port, dbname=CELL_DBNAME, user=SUPERUSER)


def _wire(endpoint: DatabaseEndpoint) -> AgentEndpoint:
    """The endpoint without its passfile (a path on the agent's machine)."""
    return AgentEndpoint(host=endpoint.host, port=endpoint.port, dbname=endpoint.dbname,
                         user=endpoint.user)


def site_layout(config: AgentConfig) -> SiteLayout:
    """Where the agent keeps its one site (for tests and tools)."""
    return SiteLayout(config.state_dir / config.site.name)
