"""Whether a planned switchover to a region may begin.

The owner asks before it stops any write: a switchover whose target cannot
replay the last WAL in time would only pause the cell and then abort. The
target must be a site of the cell whose standby streams, no further behind
than the cell allows. Pure: the caller reads the target's site report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["SwitchoverRefusal", "TargetStandby", "SwitchoverAllowed", "SwitchoverRefused",
           "switchover_eligibility"]


class SwitchoverRefusal(StrEnum):
    NO_SITE = "NoSite"
    """The cell has no site in the region asked for."""
    NOT_A_STANDBY = "NotAStandby"
    """The region's site has not reported as a standby with a database yet."""
    NOT_STREAMING = "NotStreaming"
    LAGGING = "Lagging"
    """The standby is further behind than the cell's ``maxStandbyLagSeconds``."""


@dataclass(frozen=True)
class TargetStandby:
    """What the target region's site last reported of itself."""

    role: str
    site: str
    has_database: bool
    streaming: bool
    lag_seconds: float | None
    message: str = ""


@dataclass(frozen=True)
class SwitchoverAllowed:
    target_site: str
    """The site the handover record names as the successor."""


@dataclass(frozen=True)
class SwitchoverRefused:
    reason: SwitchoverRefusal
    message: str


def switchover_eligibility(target: str, *, site_regions: Sequence[str],
                           standby: TargetStandby | None,
                           max_lag_seconds: float) -> SwitchoverAllowed | SwitchoverRefused:
    """May the owner hand the cell to ``target`` now? ``standby`` is the target's site
    report (None: it has reported nothing)."""
    if target not in site_regions:
        return SwitchoverRefused(SwitchoverRefusal.NO_SITE,
                                 f"cannot switch over to {target}: the cell has sites only in "
                                 f"{', '.join(site_regions)}")
    if standby is None or standby.role != "standby" or not standby.has_database:
        return SwitchoverRefused(SwitchoverRefusal.NOT_A_STANDBY,
                                 f"cannot switch over to {target}: its site is not a standby yet")
    if not standby.streaming:
        return SwitchoverRefused(SwitchoverRefusal.NOT_STREAMING,
                                 f"cannot switch over to {target}: its standby is not streaming "
                                 f"({standby.message or 'no reason given'})")
    lag = standby.lag_seconds or 0.0
    if lag > max_lag_seconds:
        return SwitchoverRefused(SwitchoverRefusal.LAGGING,
                                 f"cannot switch over to {target}: its standby is {lag:.1f}s "
                                 f"behind (max {max_lag_seconds:g}s)")
    return SwitchoverAllowed(standby.site)
