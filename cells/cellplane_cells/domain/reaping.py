"""What one pass of the reaper does with expired claims: take them back, pace them, or wait.

A reaper that takes back every expired claim is dangerous exactly when many
expire at once, and the usual cause of that is not many dead workers: it is
our own outage. A cell's heartbeats and its reaper both write to the cell's
database, so a database that stalls, is unreachable or refuses writes (a
fence, a lease that ran out, a takeover) stops both. When it comes back,
every claim that was running looks dead while most of their workers are alive
and still calling their targets; taking them all back would start a second
copy of every running job. Two rules, both over the database's clock (a
census read in the same transaction as the pass's writes, so a pass that
started before an outage acts only on what had expired by its start):

1. **Grace after our own outage.** When this reaper's last successful pass is
   more than ``outage_after_seconds`` ago (or it has made none: a process
   started after a crash, a fence or a takeover), heartbeats could not be
   written either. Instead of reaping, the pass gives every expired claim a
   new lease of one lease from now. A live worker renews it with its next
   heartbeat (well inside a lease); a dead worker's claim runs out again and is
   reaped by the passes after, one lease later than it would have been. The
   grace is given once per outage: the pass that gives it is a successful
   pass, so the next one is steady.
2. **Pacing in a storm.** In steady state a pass takes back at most
   ``max(storm_floor, ceil(storm_share x running))`` claims, the ones whose
   heartbeat is oldest first. The floor is one worker process's slots (its
   death is reaped at once, whatever the cell's size); a larger share of the
   cell's running claims expiring within one pass is what a stall on our side
   (one process's connection, its event loop) looks like, and each pass gives
   the heartbeats behind it another reap interval to land. Every expired claim
   is still taken back within ``ceil(1 / storm_share)`` passes: the limit
   set when a storm starts is kept until it is over.

``ReaperMode.IMMEDIATE`` is the old behaviour (every expired claim at once),
kept for comparison in tests and benchmarks.
"""

from __future__ import annotations

import datetime
import enum
import math
from dataclasses import dataclass

__all__ = ["ReaperMode", "ReaperPolicy", "LeaseCensus", "ReaperHealth", "Decision", "ReapPlan",
           "plan_pass"]


class ReaperMode(str, enum.Enum):
    ADAPTIVE = "adaptive"
    """Grace after our own outage, pacing in a storm (the module's two rules)."""
    IMMEDIATE = "immediate"
    """Every expired claim is taken back as soon as it is seen (before issue #19)."""


@dataclass(frozen=True)
class ReaperPolicy:
    lease_seconds: float
    """A claim's lease: also the grace given after our own outage."""
    reap_seconds: float
    """The interval between two passes."""
    mode: ReaperMode = ReaperMode.ADAPTIVE
    storm_floor: int = 10
    """Expired claims a pass always takes back at once (a worker process's default slots)."""
    storm_share: float = 0.25
    """Share of the running claims above which (and above the floor) expiries are paced."""
    batch: int = 500
    """Most claims one pass takes back, whatever the mode (one statement's worth)."""

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0 or self.reap_seconds <= 0:
            raise ValueError("the lease and the reap interval must be positive")
        if self.storm_floor < 1 or not 0 < self.storm_share <= 1 or self.batch < 1:
            raise ValueError("storm_floor and batch must be at least 1, storm_share in (0, 1]")

    @property
    def outage_after_seconds(self) -> float:
        """A gap between two passes longer than this was our own outage.

        Longer than a lease: only then can a live worker's claim have expired
        unseen. And longer than two reap intervals, so that a reaper configured
        to pass less often than once a lease is not in "recovery" at every pass
        (it would then never reap)."""
        return max(self.lease_seconds, 2 * self.reap_seconds)

    def pass_limit(self, running: int) -> int:
        """The most claims one steady pass takes back, with ``running`` claims in the cell."""
        return min(self.batch, max(self.storm_floor, math.ceil(self.storm_share * running)))


@dataclass(frozen=True)
class LeaseCensus:
    """The running claims as one pass sees them, on the database's clock."""

    now: datetime.datetime
    running: int
    """Claims in the running state (expired ones included)."""
    expired: int
    """Of those, the claims whose lease has run out."""


@dataclass(frozen=True)
class ReaperHealth:
    """What a reaper remembers of itself between passes."""

    last_pass_at: datetime.datetime | None = None
    """The database's clock at this reaper's last successful pass; None: none yet."""
    pace: int = 0
    """The limit of the storm being paced (0: none). Kept while the storm lasts, so the
    limit does not shrink as its claims are taken back and the running count falls."""

    def after_pass(self, now: datetime.datetime, plan: ReapPlan) -> ReaperHealth:
        return ReaperHealth(last_pass_at=now,
                            pace=plan.reap_limit if plan.decision is Decision.PACE else 0)


class Decision(enum.Enum):
    IDLE = "idle"
    """Nothing has expired."""
    GRACE = "grace"
    """Our own outage: every expired claim gets one more lease, nothing is reaped."""
    REAP = "reap"
    """Every expired claim is taken back."""
    PACE = "pace"
    """A storm: the claims with the oldest heartbeats are taken back, up to the limit."""


@dataclass(frozen=True)
class ReapPlan:
    decision: Decision
    reap_limit: int = 0
    """How many expired claims the pass takes back (oldest lease first)."""
    grace_seconds: float = 0.0
    """The new lease given to every expired claim (GRACE only)."""
    why: str = ""
    """For the log line."""


def plan_pass(policy: ReaperPolicy, health: ReaperHealth, census: LeaseCensus) -> ReapPlan:
    """What this pass does, from the reaper's memory of itself and what it sees now."""
    if census.expired == 0:
        return ReapPlan(Decision.IDLE)
    if policy.mode is ReaperMode.IMMEDIATE:
        return ReapPlan(Decision.REAP, reap_limit=policy.batch, why="immediate mode")
    if health.last_pass_at is None:
        return ReapPlan(Decision.GRACE, grace_seconds=policy.lease_seconds,
                        why="first pass of this reaper: the cell may be starting after an outage")
    gap = (census.now - health.last_pass_at).total_seconds()
    if gap > policy.outage_after_seconds:
        return ReapPlan(Decision.GRACE, grace_seconds=policy.lease_seconds,
                        why=f"no pass for {gap:.1f} s (more than {policy.outage_after_seconds:g} s):"
                            " heartbeats could not be written either")
    limit = max(policy.pass_limit(census.running), health.pace)
    if census.expired <= limit:
        return ReapPlan(Decision.REAP, reap_limit=limit)
    return ReapPlan(Decision.PACE, reap_limit=limit,
                    why=f"{census.expired} of {census.running} running claims expired at once"
                        f" (more than {limit})")
