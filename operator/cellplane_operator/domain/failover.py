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
           "lag_at_loss", "Candidacy", "candidacy", "FORCE_FAILOVER", "SWITCHOVER_TO",
           "TakeoverRecord", "WitnessRecord", "witness_record", "restored_witness"]

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


@dataclass(frozen=True)
class TakeoverRecord:
    """A site that took the epoch from another, once it serves: the Cell's
    ``status.lastTakeover`` and the ``TookOver`` Event say it. Kept in the new primary's
    site report in etcd until the status shows it, so that neither an apiserver that was
    away nor an operator restart loses it."""

    epoch: int
    from_region: str | None
    to_region: str
    planned: bool
    seconds: float
    """From the previous owner's end (as this site saw it) to serving."""
    promoted_in: float
    at: str
    """When it served, as the Cell's status writes times (UTC, seconds)."""

    def to_status(self) -> dict[str, object]:
        return {"epoch": self.epoch, "fromRegion": self.from_region, "toRegion": self.to_region,
                "planned": self.planned, "seconds": round(self.seconds, 3), "at": self.at}

    def event_message(self, site: str) -> str:
        how = "switchover" if self.planned else "takeover"
        return (f"{site} serves the cell under epoch {self.epoch} after a {how} from "
                f"{self.from_region}: {self.seconds:.2f}s from the previous owner's end "
                f"(promotion {self.promoted_in:.2f}s)")


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


@dataclass(frozen=True)
class WitnessRecord:
    """A ``StandbyWitness`` on the wall clock, kept where the region's next operator finds it.

    The witness lives in the operator's memory, on its monotonic clock; an operator
    restarted during a region loss knew nothing of its standby and refused to promote
    one that had streamed with no lag. The record is written by the
    region's operator and read only by its successor on the same state directory
    (the same machine), so the two wall-clock readings compared are one clock's.
    """

    last_streaming_at: float | None
    """POSIX seconds."""
    lag_while_streaming: float
    not_streaming_since: float | None

    def encode(self) -> bytes:
        return json.dumps({"lastStreamingAt": self.last_streaming_at,
                           "lagWhileStreaming": self.lag_while_streaming,
                           "notStreamingSince": self.not_streaming_since}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> WitnessRecord:
        body = json.loads(raw)
        return cls(last_streaming_at=_seconds(body.get("lastStreamingAt")),
                   lag_while_streaming=float(body.get("lagWhileStreaming") or 0.0),
                   not_streaming_since=_seconds(body.get("notStreamingSince")))


def _seconds(value: object) -> float | None:
    return None if value is None else float(str(value))


def witness_record(witness: StandbyWitness, *, monotonic_now: float,
                   wall_now: float) -> WitnessRecord:
    def wall(moment: float | None) -> float | None:
        return None if moment is None else wall_now - (monotonic_now - moment)

    return WitnessRecord(last_streaming_at=wall(witness.last_streaming_at),
                         lag_while_streaming=witness.lag_while_streaming,
                         not_streaming_since=wall(witness.not_streaming_since))


def restored_witness(record: WitnessRecord | None, *, monotonic_now: float,
                     wall_now: float) -> StandbyWitness:
    """What a restarted operator may still claim from its predecessor's record, under the
    rule of ``lag_at_loss``: streaming is never assumed past the last reading that saw it,
    so a record that says "streaming at T" is read as "cut off since T" (the primary's
    writes after T count as lag) until this process sees the standby stream itself. A
    record dated after now (the clock was set back) proves nothing: as if it never streamed.
    """
    if record is None or record.last_streaming_at is None:
        return StandbyWitness()
    cut_off = (record.not_streaming_since if record.not_streaming_since is not None
               else record.last_streaming_at)
    if max(record.last_streaming_at, cut_off) > wall_now:
        return StandbyWitness()
    return StandbyWitness(last_streaming_at=monotonic_now - (wall_now - record.last_streaming_at),
                          lag_while_streaming=record.lag_while_streaming,
                          not_streaming_since=monotonic_now - (wall_now - cut_off))


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
