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

__all__ = ["SiteKey", "ServingSpec", "DatabaseEndpoint", "SiteEndpoints", "SiteHealth",
           "SiteDriver"]


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
    allow_private_targets: bool = False
    """Development mode of the cell: loopback targets and webhooks allowed."""


@dataclass(frozen=True)
class DatabaseEndpoint:
    host: str
    port: int
    dbname: str
    user: str

    @property
    def conninfo(self) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={self.dbname}"


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


class SiteDriver(Protocol):
    async def ensure_primary_database(self, site: SiteKey) -> DatabaseEndpoint:
        """A running, migrated primary database for the site: adopted if it runs, started
        if it is stopped, created if it does not exist. Idempotent."""

    async def ensure_standby_database(self, site: SiteKey, primary: DatabaseEndpoint) -> DatabaseEndpoint:
        """A running standby of ``primary`` for the site (base backup on first use). Idempotent."""

    async def promote_database(self, site: SiteKey) -> DatabaseEndpoint:
        """The site's standby becomes a primary, then checkpoints (without that checkpoint
        pg_rewind against it wrongly finds nothing to rewind). Idempotent on a primary."""

    async def fence_database(self, site: SiteKey) -> None:
        """The site's Postgres, an old primary, is fenced: every connection rejected, every
        session ended, the server stopped, and kept stopped by ``check``. Idempotent; when
        the server is already down only its configuration changes."""

    async def rebuild_as_standby(self, site: SiteKey, primary: DatabaseEndpoint) -> DatabaseEndpoint:
        """The fenced site becomes a streaming standby of ``primary``: pg_rewind, or a fresh
        base backup when rewind fails. What the site committed past the fork is lost."""

    async def start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        """API and workers under ``spec.epoch``. Processes already running under that epoch
        are adopted; processes of another epoch are stopped first. Never two sets at once."""

    async def stop_serving(self, site: SiteKey) -> None:
        """Stops the site's API and workers (its database keeps running)."""

    async def check(self, site: SiteKey) -> SiteHealth:
        """Health of the site; restarts processes that should run and died."""

    async def destroy(self, site: SiteKey) -> None:
        """Stops every process of the site and removes its data."""
