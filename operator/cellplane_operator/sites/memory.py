"""Every region's sites in memory: the fake of ``SiteDriver`` and ``CellDatabases``.

What the local driver does with processes and Postgres, kept as a few fields per
site, so that a controller's whole loop runs in a unit test. What it keeps is what
the operator can observe through the two ports, and ``tests/sitecontract.py`` holds
it to the local driver's answers: the database roles and which of them may be used
for what, serving under one epoch at a time, a standby that streams from its primary
and replays what it wrote, a demoted primary's last location, the grant (an epoch and
a deadline the database keeps by its own clock, here the injected monotonic clock).

Faults a test can cause: a region lost whole (``lose_region``: its sites answer
nothing, its databases are down for whoever streams from them), a database or the
serving processes that died (``crash_database``, ``crash_serving``: ``check``
restarts them), a standby that replays nothing more (``replay_held``) or reports a
lag (``lag_seconds``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cellplane_operator.clock import MonotonicClock
from cellplane_operator.errors import SiteError
from cellplane_operator.sites.base import (
    DatabaseEndpoint,
    ServingSpec,
    SiteEndpoints,
    SiteHealth,
    SiteKey,
)

__all__ = ["InMemorySites", "FakeSite", "FakeGrant", "POSTGRES"]

POSTGRES = "postgres"
"""The name ``check`` gives a restarted database, as the local driver does."""
SERVING = "api"
"""The name ``check`` gives restarted serving processes."""
_KEPT_DOWN = frozenset({"fenced", "demoted"})


@dataclass(frozen=True)
class FakeGrant:
    """A cell database's placement-group row: the epoch it takes writes under, and until."""

    epoch: int
    deadline: float
    """On the monotonic clock: no write is taken from then on."""
    fence_reason: str | None = None


@dataclass
class FakeSite:
    key: SiteKey
    role: str | None = None
    """``primary``, ``standby``, ``fenced``, ``demoted``; None: no database yet."""
    database_up: bool = False
    follows: DatabaseEndpoint | None = None
    """A standby's primary."""
    serving: ServingSpec | None = None
    warm: ServingSpec | None = None
    serving_dead: bool = False
    lsn: int = 0
    """A primary's end of WAL; a standby's replay location."""
    handover_lsn: int | None = None
    grant: FakeGrant | None = None
    open_for_reading: bool = False
    lag_seconds: float = 0.0
    """What a streaming standby reports as its replay lag."""
    replay_held: bool = False
    checks: int = 0
    """How many times ``check`` looked at the site: a test's count of a runner's passes."""

    @property
    def endpoint(self) -> DatabaseEndpoint:
        return DatabaseEndpoint(host=f"{self.key.region}.{self.key.cell}.sites.test", port=5432,
                                dbname="cellplane", user="postgres")

    @property
    def endpoints(self) -> SiteEndpoints:
        base = f"http://{self.key.region}.{self.key.cell}.sites.test"
        return SiteEndpoints(api=f"{base}:9000", admin=f"{base}:9001")


class InMemorySites:
    """``SiteDriver`` and ``CellDatabases`` over one in-memory world of sites (every region's:
    a standby reads its primary in another region, as a real one streams from it)."""

    def __init__(self, clock: MonotonicClock) -> None:
        self._clock = clock
        self.sites: dict[SiteKey, FakeSite] = {}
        self.lost_regions: set[str] = set()

    # -- faults and observations ----------------------------------------------------------

    def lose_region(self, region: str) -> None:
        self.lost_regions.add(region)

    def crash_database(self, site: SiteKey) -> None:
        self._site(site).database_up = False

    def crash_serving(self, site: SiteKey) -> None:
        self._site(site).serving_dead = True

    def accepts_writes(self, site: SiteKey, epoch: int) -> bool:
        """Whether the site's database would take a write made under ``epoch`` now."""
        found = self.sites.get(site)
        if found is None or found.role != "primary" or not found.database_up:
            return False
        grant = found.grant
        return (grant is not None and grant.epoch == epoch and grant.fence_reason is None
                and self._clock.monotonic() < grant.deadline)

    # -- SiteDriver -----------------------------------------------------------------------

    async def ensure_primary_database(self, site: SiteKey) -> DatabaseEndpoint:
        found = self._reach(site, create=True)
        if found.role == "fenced":
            raise SiteError(f"{site.name} is fenced: it cannot be used as a primary")
        if found.role == "standby":
            raise SiteError(f"{site.name} holds a standby; promote it before using it as primary")
        found.role, found.database_up, found.open_for_reading = "primary", True, False
        found.handover_lsn = None
        return found.endpoint

    async def ensure_standby_database(self, site: SiteKey,
                                      primary: DatabaseEndpoint) -> DatabaseEndpoint:
        found = self._reach(site, create=True)
        if found.role in _KEPT_DOWN:
            raise SiteError(f"{site.name} is {found.role}: it cannot be adopted as a standby "
                            "(rebuild_as_standby rewinds it)")
        if found.role == "primary":
            raise SiteError(f"{site.name} is a primary: it is not made a standby in place")
        if found.role is None:
            found.lsn = 0
        found.role, found.follows, found.database_up = "standby", primary, True
        self._replay(found)
        return found.endpoint

    async def promote_database(self, site: SiteKey) -> DatabaseEndpoint:
        found = self._reach(site)
        if found.role is None:
            raise SiteError(f"{site.name} has no database to promote")
        if found.role in _KEPT_DOWN:
            raise SiteError(f"{site.name} is {found.role}: it cannot be promoted")
        found.role, found.follows, found.database_up = "primary", None, True
        return found.endpoint

    async def database_role(self, site: SiteKey) -> str | None:
        self._check_reachable(site)
        found = self.sites.get(site)
        return None if found is None else found.role

    async def demote_for_handover(self, site: SiteKey) -> str:
        found = self._reach(site)
        if found.role == "demoted" and found.handover_lsn is not None:
            return _lsn(found.handover_lsn)
        if found.role != "primary":
            raise SiteError(f"{site.name} is not a primary: only a primary is demoted")
        if not found.database_up:
            raise SiteError(f"{site.name} was not shut down cleanly: its end of WAL is unknown")
        found.lsn += 1  # the shutdown checkpoint
        for other in self.sites.values():  # what streams before the shutdown is replayed
            self._replay(other)
        found.role, found.database_up, found.handover_lsn = "demoted", False, found.lsn
        return _lsn(found.lsn)

    async def open_fenced_for_reading(self, site: SiteKey) -> str:
        found = self._reach(site)
        if found.role not in _KEPT_DOWN:
            raise SiteError(f"{site.name} is neither fenced nor demoted: it is not opened for "
                            "reading")
        found.open_for_reading = True
        return f"host=/private/{site.name} dbname=cellplane user=postgres"

    async def close_fenced_reading(self, site: SiteKey) -> None:
        found = self.sites.get(site)
        if found is not None:
            found.open_for_reading = False

    async def fence_database(self, site: SiteKey) -> None:
        found = self._reach(site, create=True)
        found.role, found.database_up = "fenced", False
        found.serving = found.warm = None

    async def rebuild_as_standby(self, site: SiteKey,
                                 primary: DatabaseEndpoint) -> DatabaseEndpoint:
        found = self._reach(site)
        if found.role == "standby" and found.follows == primary:
            found.database_up = True
            return found.endpoint
        if found.role not in _KEPT_DOWN:
            raise SiteError(f"{site.name} is neither fenced nor demoted: fence_database before "
                            "rebuilding it")
        found.role, found.follows, found.database_up = "standby", primary, True
        found.open_for_reading, found.handover_lsn = False, None
        found.lsn = 0  # rewound onto the primary's timeline: past the fork is gone
        self._replay(found)
        return found.endpoint

    async def start_serving(self, site: SiteKey, spec: ServingSpec) -> SiteEndpoints:
        found = self._reach(site)
        if found.role != "primary":
            raise SiteError(f"{site.name} has no primary database: ensure_primary_database first")
        found.database_up = True
        found.serving, found.warm, found.serving_dead = spec, None, False
        return found.endpoints

    async def warm_up(self, site: SiteKey, spec: ServingSpec) -> None:
        found = self._reach(site)
        if found.role != "standby":
            raise SiteError(f"{site.name} is not a standby: only a standby's API is warmed up")
        found.warm = replace(spec, worker_processes=0)

    async def stop_serving(self, site: SiteKey) -> None:
        self._check_reachable(site)
        found = self.sites.get(site)
        if found is not None:
            found.serving = found.warm = None

    async def check(self, site: SiteKey) -> SiteHealth:
        self._check_reachable(site)
        found = self.sites.get(site)
        if found is None:
            return SiteHealth(database_up=False, serving=False, epoch=None, endpoints=None)
        found.checks += 1
        restarted: list[str] = []
        if not found.database_up and found.role in ("primary", "standby"):
            found.database_up = True
            restarted.append(POSTGRES)
        if found.serving is not None and found.serving_dead:
            found.serving_dead = False
            restarted.append(SERVING)
        self._replay(found)
        return self._health(found, tuple(restarted))

    async def destroy(self, site: SiteKey) -> None:
        self._check_reachable(site)
        self.sites.pop(site, None)

    # -- CellDatabases --------------------------------------------------------------------

    async def grant(self, conninfo: str, epoch: int, seconds: float,
                    fence_reason: str | None) -> None:
        found = self._by_conninfo(conninfo)
        if found.role != "primary" or not found.database_up:
            raise SiteError(f"{found.key.name} takes no grant: it is not a running primary")
        now, before = self._clock.monotonic(), found.grant
        if before is not None and epoch < before.epoch:
            raise SiteError(f"stale epoch: {epoch} is below the placement group's epoch "
                            f"{before.epoch}")
        if seconds <= 0 and before is not None and before.epoch == epoch:
            deadline = min(before.deadline, now)  # a late stop keeps the deadline in force
        else:
            deadline = now + max(seconds, 0.0)
        found.grant = FakeGrant(epoch, deadline, fence_reason)
        found.lsn += 1  # a write: it streams to the standbys

    async def replayed(self, standby: str, lsn: str, *, timeout_seconds: float) -> bool:
        try:
            found = self._by_conninfo(standby)
        except SiteError:
            return False
        self._replay(found)
        return found.role == "standby" and found.lsn >= _parse_lsn(lsn)

    # -- inside ---------------------------------------------------------------------------

    def _health(self, found: FakeSite, restarted: tuple[str, ...]) -> SiteHealth:
        up = found.database_up
        standby = found.role == "standby"
        serving = (found.serving is not None and up and found.role == "primary"
                   and not found.serving_dead)
        running = found.serving or found.warm
        streaming = up and standby and self._primary_of(found) is not None
        return SiteHealth(
            database_up=up, serving=serving,
            epoch=running.epoch if running is not None and not found.serving_dead else None,
            endpoints=found.endpoints if running is not None else None,
            restarted=restarted, in_recovery=standby if up else None,
            replay_lag_seconds=found.lag_seconds if up and standby else None,
            streaming=streaming,
            replay_lsn=_lsn(found.lsn) if up and standby else None,
            receive_lsn=_lsn(found.lsn) if streaming else None)

    def _primary_of(self, standby: FakeSite) -> FakeSite | None:
        """The running primary ``standby`` streams from, if it reaches one."""
        for other in self.sites.values():
            if (other.endpoint == standby.follows and other.role == "primary"
                    and other.database_up and other.key.region not in self.lost_regions):
                return other
        return None

    def _replay(self, found: FakeSite) -> None:
        if found.role != "standby" or not found.database_up or found.replay_held:
            return
        primary = self._primary_of(found)
        if primary is not None:
            found.lsn = max(found.lsn, primary.lsn)
            found.grant = primary.grant

    def _site(self, site: SiteKey) -> FakeSite:
        found = self.sites.get(site)
        if found is None:
            raise SiteError(f"{site.name} has no site")
        return found

    def _check_reachable(self, site: SiteKey) -> None:
        if site.region in self.lost_regions:
            raise SiteError(f"{site.name}: region {site.region} does not answer")

    def _reach(self, site: SiteKey, *, create: bool = False) -> FakeSite:
        self._check_reachable(site)
        if create:
            return self.sites.setdefault(site, FakeSite(site))
        return self._site(site)

    def _by_conninfo(self, conninfo: str) -> FakeSite:
        for found in self.sites.values():
            if found.endpoint.conninfo == conninfo:
                if found.key.region in self.lost_regions:
                    break
                return found
        raise SiteError("the cell database does not answer")


def _lsn(position: int) -> str:
    return f"0/{position:X}"


def _parse_lsn(lsn: str) -> int:
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)
