"""Planned switchover: the owner hands its cell to a standby region with nothing lost.

Asked by the Cell annotation ``cellplane.io/switchover-to: <region>`` (which
``cellplane switchover`` sets). The owner runs it, in this order, so that no
write can land after the point the successor has replayed:

1. the database grant ends (the cell database refuses every write from now);
2. the primary's Postgres shuts down cleanly (its shutdown checkpoint is the
   last WAL it will ever write as this primary);
3. the standby's replay reaches that checkpoint (else: abort, start again);
4. the owner key is released in one transaction with a handover record naming
   the successor, which acquires epoch+1 at once, without the margin;
5. the successor promotes, checkpoints and serves; this site, now an old
   primary with nothing to lose, is rebuilt as its standby (``retire.py``).

The write pause runs from 1 to the successor serving; ``benchmarks/switchover.py``
measures it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from cellplane_operator.domain.failover import SWITCHOVER_TO, Handover
from cellplane_operator.domain.ownership import database_grant
from cellplane_operator.domain.switchover import (
    SwitchoverRefused, TargetStandby, switchover_eligibility,
)
from cellplane_operator.errors import CellplaneError
from cellplane_operator.ownership import LeaseHolder
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.ownership.table import GroupView
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.sites.base import SiteKey
from cellplane_operator.sites.reports import SiteReport

__all__ = ["PlannedHandover", "HandingSite", "CATCH_UP_TIMEOUT_SECONDS"]

log = logging.getLogger(__name__)

CATCH_UP_TIMEOUT_SECONDS = 10.0
"""How long writes may stay stopped while the standby replays the last WAL; then abort."""


class HandingSite(Protocol):
    """What the handover needs of the site that owns the cell (``CellSiteRunner``): named
    here so that this module need not import the runner that runs it."""

    cell: CellSettings
    site: SiteKey

    @property
    def body(self) -> dict[str, Any]: ...

    @property
    def holder(self) -> LeaseHolder: ...

    @property
    def grant(self) -> CellDatabaseGrant: ...

    def remove_annotations(self, keys: list[str]) -> None: ...


class PlannedHandover:
    def __init__(self, ctx: RegionContext, runner: HandingSite) -> None:
        self._ctx = ctx
        self._runner = runner
        self.in_progress = False
        """True from the end of the grant to the release: renewals must not grant again."""
        self._refusal_said: str | None = None

    async def run(self, target: str, epoch: int, group: GroupView) -> None:
        runner, ctx, clock = self._runner, self._ctx, self._ctx.clock
        report = await self._target_report(target)
        decision = switchover_eligibility(
            target, site_regions=runner.cell.site_regions, standby=_standby(report),
            max_lag_seconds=runner.cell.max_standby_lag_seconds)
        if isinstance(decision, SwitchoverRefused):
            if decision.message != self._refusal_said:
                self._refusal_said = decision.message
                await ctx.event(runner.body, "Warning", "SwitchoverRefused", decision.message)
            return
        # The decision saw the report's database.
        assert report is not None and report.database is not None
        self._refusal_said = None
        await ctx.event(runner.body, "Normal", "SwitchoverStarted",
                        f"handing epoch {epoch} from {ctx.region} to {target}: writes stop now")
        began = clock.monotonic()
        self.in_progress = True
        try:
            await runner.grant.stop_acting(epoch, f"planned switchover to {target}")
            caught_up_lsn = await ctx.driver.demote_for_handover(runner.site)
            stopped = clock.monotonic()
            if not await ctx.databases.replayed(report.database.conninfo, caught_up_lsn,
                                                timeout_seconds=CATCH_UP_TIMEOUT_SECONDS):
                await self._abort(epoch, target, caught_up_lsn)
                return
            caught_up = clock.monotonic()
            handover = Handover(source_region=ctx.region, target_region=target,
                                target_site=decision.target_site, epoch=epoch,
                                caught_up_lsn=caught_up_lsn)
            if not await runner.holder.release(handover):
                log.error("%s: the owner key was no longer ours at the handover",
                          runner.site.name)
        finally:
            self.in_progress = False
        released = clock.monotonic()
        await ctx.event(runner.body, "Normal", "SwitchoverHandedOver",
                        f"epoch {epoch} released to {target} {released - began:.2f}s after "
                        f"writes stopped (clean shutdown {stopped - began:.2f}s, standby "
                        f"replayed {caught_up_lsn} {caught_up - stopped:.2f}s later)")
        try:
            await ctx.driver.stop_serving(runner.site)
        except CellplaneError as error:
            log.warning("%s: could not stop the old API and workers: %s", runner.site.name, error)

    async def _target_report(self, target: str) -> SiteReport | None:
        """The target's site report; not read for a region the cell has no site in."""
        cell = self._runner.cell
        if target not in cell.site_regions:
            return None
        return await self._ctx.reports.read(cell.name, target)

    async def _abort(self, epoch: int, target: str, lsn: str) -> None:
        """The standby did not replay the last WAL in time: this site serves again, and the
        request is withdrawn so that it does not stop writes again at the next pass."""
        runner, ctx = self._runner, self._ctx
        await ctx.driver.ensure_primary_database(runner.site)
        holder = runner.holder
        remaining = database_grant(holder.state, now=ctx.clock.monotonic(),
                                   settings=runner.cell.lease)
        self.in_progress = False
        if remaining > 0:
            await runner.grant.start_acting(epoch, remaining)
        message = (f"{target} had not replayed {lsn} after {CATCH_UP_TIMEOUT_SECONDS:g}s: "
                   f"switchover aborted, {ctx.region} serves again under epoch {epoch}")
        await ctx.event(runner.body, "Warning", "SwitchoverAborted", message)
        runner.remove_annotations([SWITCHOVER_TO])


def _standby(report: SiteReport | None) -> TargetStandby | None:
    if report is None:
        return None
    return TargetStandby(role=report.role, site=report.site,
                         has_database=report.database is not None, streaming=report.streaming,
                         lag_seconds=report.lag_seconds, message=report.message)

