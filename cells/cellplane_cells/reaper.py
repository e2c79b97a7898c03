"""The reaper's pass: read the claims, let ``domain/reaping.py`` decide, act, remember.

Each worker process runs one ``Reaper`` in its reaper loop. A pass is one
transaction (the census and the writes share the database's ``now()``); only a
pass that committed counts as the reaper's last successful one, so a pass
refused or cut off by an outage leaves the reaper's memory of its last good
pass where it was, and the first pass after the outage sees the gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from cellplane_cells import jobqueue
from cellplane_cells.db import translate_errors
from cellplane_cells.domain.reaping import (
    Decision, LeaseCensus, ReaperHealth, ReaperPolicy, ReapPlan, plan_pass,
)

__all__ = ["Reaper", "PassReport"]


@dataclass(frozen=True)
class PassReport:
    census: LeaseCensus
    plan: ReapPlan
    reaped: list[dict[str, Any]] = field(default_factory=list)
    """The claims taken back (job_id, tenant_id, status)."""
    graced: int = 0
    """Expired claims given a new lease instead."""

    @property
    def paced(self) -> int:
        """Expired claims left for a later pass (a storm's pace)."""
        if self.plan.decision is not Decision.PACE:
            return 0
        return max(self.census.expired - len(self.reaped), 0)


class Reaper:
    """One process's reaper: its policy and what it remembers of its own passes."""

    def __init__(self, policy: ReaperPolicy) -> None:
        self.policy = policy
        self.health = ReaperHealth()

    def run_pass(self, conn: psycopg.Connection[Any]) -> PassReport:
        with translate_errors(), conn.transaction():
            census = jobqueue.lease_census(conn)
            plan = plan_pass(self.policy, self.health, census)
            reaped: list[dict[str, Any]] = []
            graced = 0
            if plan.grace_seconds > 0:
                graced = jobqueue.grant_recovery_grace(conn, grace_seconds=plan.grace_seconds)
            elif plan.reap_limit > 0:
                reaped = jobqueue.reap(conn, batch=plan.reap_limit)
        # Committed: this pass is the reaper's last good one.
        self.health = self.health.after_pass(census.now, plan)
        return PassReport(census, plan, reaped, graced)
