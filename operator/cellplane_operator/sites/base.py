"""What the regional operator asks of whatever runs a cell's sites.

A site is one region's copy of a cell: a Postgres instance and, on the primary
site, the cell API and worker processes. The operator decides (ownership,
epochs, which region is primary); the driver only makes processes match and
reports what it sees. The local driver runs loopback processes; a Kubernetes
driver (Deployments and a CloudNativePG cluster) implements the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cellplane_cells.domain.priorities import Floors

__all__ = ["SiteKey", "ServingSpec", "DatabaseEndpoint", "SiteEndpoints", "SiteHealth",
           "SiteDriver", "CellDatabases"]


@dataclass(frozen=True)
class SiteKey:
    cell: str
    region: str

    @property
    def name(self) -> str:
        """The site's name, stable over restarts: ``<cell>@<region>``."""
        return f"{self.cell}@{self.region}"


@dataclass(frozen=True)
class ServingSpec:
    """How the primary site's processes run."""

    epoch: int
    """The placement-group epoch the API and workers act under."""
    admin_token: str
    """Bearer token of the cell's admin API."""
    worker_processes: int = 1
    slots_per_worker: int = 10
    priority_floors: Floors | None = None
    """Each worker's slots reserved per priority class (``--priority-floors``); None leaves
    the worker's default shares."""
    allow_private_targets: bool = False
    """Development mode of the cell: loopback targets and webhooks allowed."""


@dataclass(frozen=True)
class DatabaseEndpoint:
    host: str
    port: int
    dbname: str
    user: str
    """The operator's role there: the superuser."""
    passfile: str | None = None
    """The libpq passfile that holds that role's password, on the machine of the site's
    operator (a path, never the password: endpoints are published in etcd). Another
    region's operator connects with its own copy of the cell's credentials."""

    @property
    def conninfo(self) -> str:
        conninfo = f"host={self.host} port={self.port} user={self.user} dbname={self.dbname}"
        return conninfo if self.passfile is None else f"{conninfo} passfile={self.passfile}"


@dataclass(frozen=True)
class SiteEndpoints:
    api: str
    """Base URL of the tenant API, e.g. ``http://127.0.0.1:41234``."""
    admin: str
    """Base URL of the admin API."""


@dataclass(frozen=True)
class SiteHealth:
    database_up: bool
    serving: bool
    """The API answers its health check and every worker process is alive."""
    epoch: int | None
    """The epoch the running API and workers were started under; None when not serving."""
    endpoints: SiteEndpoints | None
    restarted: tuple[str, ...] = field(default_factory=tuple)
    """Processes this check found dead and started again (for Events)."""
    in_recovery: bool | None = None
    """True on a standby; None when the database is down."""
    replay_lag_seconds: float | None = None
    """A standby's replay lag behind its primary; None on a primary or when unknown."""
    streaming: bool = False
    """A standby receives WAL from its primary right now."""
    replay_lsn: str | None = None
    """How far a standby has replayed (``pg_last_wal_replay_lsn``); None on a primary or down."""
    receive_lsn: str | None = None
    """How far a standby has received WAL (``pg_last_wal_receive_lsn``); None on a primary,
    when down, or when it has streamed nothing since it started."""


class SiteDriver(Protocol):
    async def ensure_primary_database(self, site: SiteKey) -> DatabaseEndpoint:
        """A running, migrated primary database for the site: adopted if it runs, started
        if it is stopped, created if it does not exist. A demoted site starts as primary
        again (a handover given up); a fenced one is refused. Idempotent."""

    async def ensure_standby_database(self, site: SiteKey, primary: DatabaseEndpoint) -> DatabaseEndpoint:
        """A running standby of ``primary`` for the site (base backup on first use). A standby
        of another primary (another standby was promoted in its place) is re-pointed: rewound
        onto ``primary``'s timeline, or cloned afresh when that fails. Idempotent."""

    async def promote_database(self, site: SiteKey) -> DatabaseEndpoint:
        """The site's standby becomes a primary, then checkpoints (without that checkpoint
        pg_rewind against it wrongly finds nothing to rewind). Idempotent on a primary."""

    async def database_role(self, site: SiteKey) -> str | None:
        """The database intent recorded for the site: ``primary``, ``standby``, ``fenced``,
        ``demoted``, or None when it has no database yet. Reads the record only and touches no
        process, so the operator can ask before anything that could start an old primary."""

    async def demote_for_handover(self, site: SiteKey) -> str:
        """A planned switchover's first step: the primary's Postgres is stopped cleanly and
        kept down (role ``demoted``: ``check`` does not restart it). Returns the location of
        its shutdown checkpoint (``'0/3000028'``), the end of all it wrote: a standby that has
        replayed up to it holds every write. Idempotent: a demoted site returns the same
        location. Raises when the server had crashed (its end of WAL is then unknown);
        ``ensure_primary_database`` brings a demoted site back either way."""

    async def open_fenced_for_reading(self, site: SiteKey) -> str:
        """The fenced or demoted site's Postgres, started read-only where only this operator
        reaches it (no TCP listener; a private unix socket), so its data can be read before a
        rebuild discards it. Runs crash recovery when it had crashed. Returns a libpq conninfo
        for the cell database. The role stays fenced or demoted. Idempotent."""

    async def close_fenced_reading(self, site: SiteKey) -> None:
        """Stops what ``open_fenced_for_reading`` started (a clean shutdown, as pg_rewind
        needs). Idempotent; a no-op when it is not open."""

    async def fence_database(self, site: SiteKey) -> None:
        """The site's Postgres, an old primary, is fenced: every connection rejected, every
        session ended, the server stopped, and kept stopped by ``check``. Idempotent; when
        the server is already down only its configuration changes."""

    async def rebuild_as_standby(self, site: SiteKey, primary: DatabaseEndpoint) -> DatabaseEndpoint:
        """The fenced or demoted site becomes a streaming standby of ``primary``: pg_rewind, or
        a fresh base backup when rewind fails. What the site committed past the fork is lost
        (after a clean handover there is nothing past it)."""

    async def start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        """API and workers under ``spec.epoch``. Processes already running under that epoch
        are adopted; processes of another epoch are stopped first. Never two sets at once."""

    async def warm_up(self, site: SiteKey, spec: ServingSpec) -> None:
        """A standby's cell API started ahead, under the epoch the site would act under if
        it took over (``spec.epoch``), without workers: ``start_serving`` under that epoch
        after a promotion adopts it instead of waiting for a new process to start. Nothing
        routes to it while another site owns the cell, and its database takes no write."""

    async def stop_serving(self, site: SiteKey) -> None:
        """Stops the site's API and workers (its database keeps running)."""

    async def check(self, site: SiteKey) -> SiteHealth:
        """Health of the site; restarts processes that should run and died."""

    async def destroy(self, site: SiteKey) -> None:
        """Stops every process of the site and removes its data."""


class CellDatabases(Protocol):
    """What the operator itself runs in a cell's databases, by their libpq conninfo
    (``DatabaseEndpoint.conninfo``): apart from
    the driver, since a standby in another region is reached the same way whatever runs it
    (``sites/celldb.py`` on Postgres; the in-memory sites in ``sites/memory.py``)."""

    async def grant(self, conninfo: str, epoch: int, seconds: float,
                    fence_reason: str | None) -> None:
        """The database's side of the lease (``cellplane_grant``): it accepts writes under
        ``epoch`` for ``seconds`` more by its own clock, and refuses a lower epoch. Zero
        ``seconds`` ends its writes now; ``fence_reason`` is the refusal it then gives
        (a fence a person put on). Raises ``SiteError`` when it did not take the grant."""

    async def replayed(self, standby: str, lsn: str, *, timeout_seconds: float) -> bool:
        """Waits until the ``standby`` database has replayed the WAL up to ``lsn``: False
        when it has not within ``timeout_seconds``, or cannot be reached."""
