"""Which site of a cell acts, and when a standby may take the cell over.

A cell has a site in its home region and one in each standby region. The site
that holds the placement group's latest epoch is the *active* one (etcd key
``/cellplane/groups/<cell>/active``, written in the same transaction that
raises the epoch); every other site is a standby of it, or an old primary that
must be fenced and rebuilt before it may be one.

A standby competes for the group only if promoting it would not silently lose
more than the cell allows (``maxStandbyLagSeconds``), unless a person forces it;
a planned handover names its successor, which then skips the margin (the old
owner has provably stopped: its database is down and holds no grant) while
the other candidates stand back. Everything here is pure: the caller passes
its monotonic clock's readings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum

__all__ = ["ActiveSite", "Handover", "SiteRole", "site_role", "StandbyWitness", "witnessed",
           "lag_at_loss", "Candidacy", "candidacy", "FORCE_FAILOVER", "SWITCHOVER_TO"]

FORCE_FAILOVER = "cellplane.io/force-failover"
"""Cell annotation naming the region whose standby is promoted whatever its lag."""
SWITCHOVER_TO = "cellplane.io/switchover-to"
"""Cell annotation naming the region the owner should hand the cell to."""


@dataclass(frozen=True)
class ActiveSite:
    """The value of ``/cellplane/groups/<cell>/active``: who holds (or last held) the epoch."""

    region: str
    site: str
    epoch: int

    def encode(self) -> bytes:
        return json.dumps({"region": self.region, "site": self.site, "epoch": self.epoch},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ActiveSite:
        body = json.loads(raw)
        return cls(region=str(body["region"]), site=str(body["site"]), epoch=int(body["epoch"]))


@dataclass(frozen=True)
class Handover:
    """The value of ``/cellplane/groups/<cell>/handover``: a planned release naming a successor.

    Valid only for the acquisition that follows ``epoch``; the successor's
    acquisition deletes it.
    """

    source_region: str
    target_region: str
    target_site: str
    epoch: int
    """The epoch the old owner released."""
    caught_up_lsn: str
    """The old primary's shutdown checkpoint, which the successor had replayed."""

    def encode(self) -> bytes:
        return json.dumps({"sourceRegion": self.source_region, "targetRegion": self.target_region,
                           "targetSite": self.target_site, "epoch": self.epoch,
                           "caughtUpLsn": self.caught_up_lsn}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Handover:
        body = json.loads(raw)
        return cls(source_region=str(body["sourceRegion"]), target_region=str(body["targetRegion"]),
                   target_site=str(body["targetSite"]), epoch=int(body["epoch"]),
                   caught_up_lsn=str(body["caughtUpLsn"]))


class SiteRole(str, Enum):
    PRIMARY = "primary"
    """This site holds or competes for the epoch and serves the cell."""
    PROMOTING = "promoting"
    """This site won the epoch but its database is still a standby: promote it."""
    STANDBY = "standby"
    """Another site is active; this one streams from it."""
    OLD_PRIMARY = "old-primary"
    """Another site is active and this one was a primary: fence, report, rebuild."""
    HANDED_OVER = "handed-over"
    """This site released the epoch for a planned handover and waits for the successor."""


def site_role(*, my_region: str, home_region: str, active: ActiveSite | None,
              database_role: str | None) -> SiteRole:
    """What this region's site of a cell is, from etcd's active record and the site's own
    database intent. Read before anything that could start the site's Postgres."""
    active_region = active.region if active is not None else home_region
    if active_region == my_region:
        if database_role == "standby":
            return SiteRole.PROMOTING
        if database_role == "demoted":
            return SiteRole.HANDED_OVER
        return SiteRole.PRIMARY
    if database_role in ("primary", "fenced", "demoted"):
        return SiteRole.OLD_PRIMARY
    return SiteRole.STANDBY


@dataclass(frozen=True)
class StandbyWitness:
    """What a standby saw of its own replication, to judge what a promotion would lose."""

    last_streaming_at: float | None = None
    lag_while_streaming: float = 0.0
    not_streaming_since: float | None = None


def witnessed(witness: StandbyWitness, *, now: float, streaming: bool,
              lag_seconds: float | None) -> StandbyWitness:
    if streaming:
        return StandbyWitness(last_streaming_at=now, lag_while_streaming=lag_seconds or 0.0)
    if witness.not_streaming_since is None:
        return replace(witness, not_streaming_since=now)
    return witness


def lag_at_loss(witness: StandbyWitness, *, now: float, owner_gone_at: float | None,
                lease_seconds: float) -> float | None:
    """How far behind the lost primary this standby is, at worst; None if it never streamed.

    The lag measured while streaming, plus the time the standby was cut off
    while the primary may still have been writing. The owner's last renewal
    was at most one lease before its key expired, so the primary wrote nothing
    (that a client saw acknowledged under a live lease) after ``owner_gone_at -
    lease``; a standby that streamed until the primary died adds nothing.
    """
    if witness.last_streaming_at is None:
        return None
    if witness.not_streaming_since is None:
        return witness.lag_while_streaming
    primary_alive_until = now if owner_gone_at is None else owner_gone_at - lease_seconds
    return witness.lag_while_streaming + max(0.0, primary_alive_until - witness.not_streaming_since)


@dataclass(frozen=True)
class Candidacy:
    compete: bool
    refusal: str | None = None
    """Why a standby holds back from an ownerless cell (a condition reason), if it does."""
    message: str = ""


def candidacy(*, my_region: str, active_region: str, automatic: bool, forced_region: str | None,
              lag_seconds: float | None, max_lag_seconds: float) -> Candidacy:
    """May this standby compete for the cell when its owner is gone?

    The lease holder still waits the margin (and the cell's failover delay)
    and wins only by compare-and-swap; this decides only whether to try.
    """
    if forced_region == my_region:
        return Candidacy(True, message=f"promotion of {my_region} forced by a person")
    if not automatic:
        return Candidacy(False, "AutomaticFailoverDisabled",
                         f"spec.failover.automatic is false: {my_region} is promoted only when "
                         f"forced (annotation cellplane.io/force-failover={my_region})")
    if lag_seconds is None:
        return Candidacy(False, "StandbyNeverStreamed",
                         f"the standby in {my_region} never streamed from {active_region}: "
                         "promoting it could lose everything since its copy was made")
    if lag_seconds > max_lag_seconds:
        return Candidacy(False, "StandbyTooFarBehind",
                         f"the standby in {my_region} was {lag_seconds:.1f}s behind "
                         f"{active_region} when it was lost (max {max_lag_seconds:g}s): not "
                         "promoted automatically; annotate the Cell with "
                         f"cellplane.io/force-failover={my_region} to promote it anyway, "
                         "losing what it lacks")
    return Candidacy(True)
