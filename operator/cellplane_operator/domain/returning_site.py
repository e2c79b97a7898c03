"""How a returning site's Postgres may start: "a returning site never accepts a write before
its epoch is checked" (issue #17).

A site's database Pod can start again at any time: its node came back after a region
loss, its link after a partition, the kubelet restarted it. The site agent then starts no
Postgres on its own (``site_objects.agent_argv``); the region's operator reads etcd's
active record for the cell and the agent's own record (the role its database last had,
the last epoch it acted under) and asks this module. Only a site etcd names as active,
under an epoch at least its own, comes up writable; an old primary comes up read-only
where only the operator reads it (its writes past the fork go to the loss report), and a
clean handover's old primary is rebuilt directly. The database's epoch and deadline
fence stays the last line behind this: a primary started here still takes no write until
its owner grants it write time.

The caller must have an answer from etcd: etcd unreachable is not "no record". Without
an answer the Pod stays held (no Postgres), which costs availability, never a write.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from cellplane_operator.domain.failover import ActiveSite

__all__ = ["RecordedRole", "ReturningSite", "StartMode", "StartDecision", "returning_start"]

RecordedRole = Literal["primary", "standby", "demoted", "fenced"]
"""The database role the site last recorded (``SiteDriver.database_role``)."""


@dataclass(frozen=True)
class ReturningSite:
    """What the site's own record says, from its volume."""

    site: str
    """``<cell>@<region>``, as etcd's active record names sites."""
    role: RecordedRole
    epoch: int | None
    """The last epoch the site acted under as primary; None if it never did."""


class StartMode(str, Enum):
    START_AS_PRIMARY = "start-as-primary"
    """Writable (once its owner grants write time): the site still owns the cell."""
    START_AS_STANDBY = "start-as-standby"
    """In recovery, streaming: never writable, so nothing to check beyond that."""
    START_FENCED_FOR_READING = "start-fenced-for-reading"
    """Read-only, reachable by the operator only: an old primary whose data is read for the
    loss report, or a site whose record contradicts etcd, kept for a person to look at."""
    REBUILD_AS_STANDBY = "rebuild-as-standby"
    """Not started as it is: pg_rewind (or a fresh base backup) onto the active primary."""


@dataclass(frozen=True)
class StartDecision:
    mode: StartMode
    reason: str


def returning_start(site: ReturningSite, active: ActiveSite | None) -> StartDecision:
    """How the site's Postgres starts, given etcd's active record now (None: etcd answered and
    holds no record for the cell).

    A standby starts as one whatever etcd says: in recovery it takes no write, and the
    operator re-points or promotes it afterwards. Among the three modes the issue names,
    none keeps a good standby as it is, hence the fourth.
    """
    mine = site.epoch or 0
    if site.role == "standby":
        return StartDecision(StartMode.START_AS_STANDBY,
                             f"{site.site} was a standby: in recovery it takes no write; the "
                             "operator re-points or promotes it once it runs")
    if active is None:
        return StartDecision(StartMode.START_FENCED_FOR_READING,
                             f"etcd holds no active site for the cell of {site.site} (never "
                             "acquired, or the Cell was deleted while the region was down): "
                             "nothing allows a write; the owner acquires first, or the site "
                             "is collected")
    if active.site == site.site:
        if site.role == "fenced":
            return StartDecision(StartMode.START_FENCED_FOR_READING,
                                 f"etcd names {site.site} active under epoch {active.epoch} but "
                                 "its database is fenced, which only a rebuild lifts: the two "
                                 "records contradict each other; a person looks")
        if active.epoch < mine:
            return StartDecision(StartMode.START_FENCED_FOR_READING,
                                 f"{site.site} acted under epoch {mine} but etcd's record has "
                                 f"{active.epoch}: etcd is behind the site (restored from an "
                                 "old snapshot?), so its record proves nothing; a person looks")
        how = "a handover given up" if site.role == "demoted" else "its owner returned"
        return StartDecision(StartMode.START_AS_PRIMARY,
                             f"etcd names {site.site} active under epoch {active.epoch} >= its "
                             f"own {mine} ({how}); it takes writes only once granted write "
                             "time under that epoch")
    if active.epoch <= mine:
        return StartDecision(StartMode.START_FENCED_FOR_READING,
                             f"etcd names {active.site} active under epoch {active.epoch}, not "
                             f"above {site.site}'s own {mine}: epochs only grow, so the records "
                             "contradict each other; a person looks")
    if site.role == "demoted":
        return StartDecision(StartMode.REBUILD_AS_STANDBY,
                             f"{site.site} handed the cell over cleanly ({active.site} holds "
                             f"epoch {active.epoch}): its successor replayed its shutdown "
                             "checkpoint, so nothing past it is lost; rewind onto the new primary")
    return StartDecision(StartMode.START_FENCED_FOR_READING,
                         f"{active.site} took the cell over under epoch {active.epoch} > "
                         f"{mine}: {site.site} is an old primary; what it wrote past the fork "
                         "is read into the loss report before the rebuild discards it")
