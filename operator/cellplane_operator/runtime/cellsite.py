"""This region's site of one cell: the active primary, a standby, or an old primary.

Read -> plan -> act -> report, once a second and whenever the placement group
or the Cell changed. Which part the site plays is read from etcd every time
(``domain/failover.site_role``): the site that holds the group's latest epoch
is the primary, every other site streams from it, and a site that was a
primary when another took the epoch is fenced, reported on and rebuilt as a
standby (``runtime/retire.py``) before it streams again.

One lease holder runs for the site all along. The primary's holder competes
for the group as soon as its database is up; a standby's competes only while
promoting it would lose no more than the cell allows, or when a person forces
it. Winning starts ``start_acting``, which promotes a standby first.

Each part has its module: the primary's (the lease's actor, serving, a planned
switchover, a fence a person put on) ``runtime/primary.py``; a standby's
``runtime/standby.py``; an old primary's ``runtime/retire.py``; the Cell's status and
its Events ``runtime/cellstatus.py``. This module runs the site and says which part
it plays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from cellplane_operator.aio import first_of
from cellplane_operator.domain.failover import FORCE_FAILOVER, ActiveSite, SiteRole, site_role
from cellplane_operator.domain.fencing import ManualFence, requested_fence
from cellplane_operator.domain.ownership import Role
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS
from cellplane_operator.metrics import standby_gone
from cellplane_operator.ownership import LeaseHolder, OwnershipTable
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.ownership.holder import HolderIdentity
from cellplane_operator.ownership.table import GroupView
from cellplane_operator.runtime.cellstatus import CellStatusReporter
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.kubewrites import PendingWrites
from cellplane_operator.runtime.primary import PrimarySite
from cellplane_operator.runtime.retire import OldPrimaryRetirement
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.runtime.standby import StandbySite
from cellplane_operator.sites.base import SiteKey
from cellplane_operator.sites.reports import SiteReport

__all__ = ["CellSiteRunner"]

log = logging.getLogger(__name__)


class CellSiteRunner:
    def __init__(self, ctx: RegionContext, body: dict[str, Any]) -> None:
        self._ctx = ctx
        self._body = body
        self.cell = CellSettings.from_body(body)
        self.site = SiteKey(self.cell.name, ctx.region)
        self._wake = asyncio.Event()
        self._holder: LeaseHolder | None = None
        self._group: GroupView | None = None
        self._last_report: SiteReport | None = None
        self._detaching = False
        self._kube_writes = PendingWrites(self.site.name)
        """Status and annotations, written beside the site's work: nothing from losing a
        lease to serving and routing waits on the Kubernetes API."""
        self._restored = False
        self._status = CellStatusReporter(ctx, self.cell.name, self._kube_writes)
        self._primary = PrimarySite(ctx, self, self._status)
        self._standby = StandbySite(ctx, self.site)
        self._retirement = OldPrimaryRetirement(ctx, self.site)

    def update(self, body: dict[str, Any]) -> None:
        self._body = body
        self.cell = CellSettings.from_body(body)
        self._wake.set()

    @property
    def body(self) -> dict[str, Any]:
        return self._body

    @property
    def holder(self) -> LeaseHolder:
        assert self._holder is not None
        return self._holder

    @property
    def grant(self) -> CellDatabaseGrant:
        grant = self._primary.grant
        assert grant is not None
        return grant

    @property
    def group(self) -> GroupView | None:
        """The placement group as the lease holder last read it."""
        return self._group

    @property
    def detaching(self) -> bool:
        return self._detaching

    def wake(self) -> None:
        """Runs the next step now instead of after the pause."""
        self._wake.set()

    @property
    def fence(self) -> ManualFence | None:
        """The fence the Cell's annotation asks for, as last seen."""
        return requested_fence(self._body["metadata"].get("annotations"))

    def annotation(self, key: str) -> str | None:
        value = (self._body["metadata"].get("annotations") or {}).get(key)
        return str(value) if value else None

    async def run(self, stop: asyncio.Event) -> None:
        """Runs the site until ``stop``; a bug that escapes a step is logged, never fatal."""
        self._holder = LeaseHolder(
            OwnershipTable(self._ctx.store),
            HolderIdentity(self.cell.name, self._ctx.region, self.site.name), self._primary,
            settings=self.cell.lease, clock=self._ctx.clock, compete=False,
            takeover_delay_seconds=self.cell.failover_delay_seconds,
            adopt_own_lease=self._ctx.settings.adopt_leases, on_group_read=self._group_read)
        holder = asyncio.create_task(self._holder.run(stop), name=f"lease-{self.site.name}")
        writes = asyncio.create_task(self._kube_writes.run(stop), name=f"kube-{self.site.name}")
        try:
            while not stop.is_set():
                # Cleared before the step, not before the pause: a wake-up that comes
                # while the step runs (an acquisition, say) must cut the next pause short.
                self._wake.clear()
                try:
                    await self._step()
                except Exception:
                    log.exception("site %s: step failed unexpectedly; again in 5s", self.site.name)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), 5.0)
                await self._pause(stop)
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await holder
            writes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writes
            if not self._detaching:
                with contextlib.suppress(CellplaneError):
                    await self._holder.release()

    def _group_read(self, group: GroupView) -> None:
        if group != self._group:
            self._group = group
            self._wake.set()

    def detach(self) -> None:
        """The operator is shutting down, not the cell: leave the site serving and the
        lease alive for the next operator of this region to adopt (or to run out)."""
        self._detaching = True

    # -- one pass ----------------------------------------------------------------

    async def _step(self) -> None:
        group = self._group
        if group is None:
            return  # etcd not read yet: nothing may start before we know who is active
        if not self._restored:
            await self._restore()
        holder = self.holder
        holder.takeover_delay_seconds = self.cell.failover_delay_seconds
        database_role = await self._ctx.driver.database_role(self.site)
        role = site_role(my_region=self._ctx.region, home_region=self.cell.region,
                         active=self._active(group), database_role=database_role)
        if role is SiteRole.PRIMARY:
            holder.compete = self._primary.has_database or database_role == "primary"
            await self._primary.step(group)
        elif role is SiteRole.PROMOTING:
            holder.compete = True
            await self._primary.promoting_step()
        elif role is SiteRole.HANDED_OVER:
            # The successor has HANDOVER_PATIENCE to take the epoch; if it does not, this
            # holder takes it back and start_acting restarts the demoted database.
            holder.compete = True
            await self.publish(SiteReport(role="primary", site=self.site.name,
                                           message="handed over; waiting for the successor"))
        elif role is SiteRole.OLD_PRIMARY:
            holder.compete = False
            await self._retire_step(group)
        else:
            await self._standby_step(group)

    async def _restore(self) -> None:
        """What this region's previous operator knew of the site and only it: what it saw of
        its standby streaming (the witness file) and the takeover it made (its site report
        in etcd, until the Cell's status shows it)."""
        try:
            own = await self._ctx.reports.read(self.cell.name, self._ctx.region)
        except CellplaneError as error:
            log.warning("%s: cannot read this site's last report: %s", self.site.name, error)
            return
        self._restored = True
        self._primary.restore_takeover(own)
        self._standby.restore_witness()

    def _active(self, group: GroupView) -> ActiveSite | None:
        """The active site; our own holder's word first, since the group it last read may
        predate the acquisition it just won."""
        state = self.holder.state
        if state.role is Role.OWNER and state.epoch is not None:
            return ActiveSite(self._ctx.region, self.site.name, state.epoch)
        return group.active

    # -- standby ---------------------------------------------------------------

    async def _standby_step(self, group: GroupView) -> None:
        active_region = group.active.region if group.active is not None else self.cell.region
        report = await self._standby.follow(self._body, active_region)
        decision = self._standby.candidacy(
            self.cell, active_region=active_region,
            owner_gone_at=self.holder.state.gone_since if group.owner is None else None,
            forced_region=self.annotation(FORCE_FAILOVER))
        # Until a site has held the epoch once, the cell is new: its home site starts it.
        self.holder.compete = decision.compete and group.active is not None
        if (group.owner is None and group.active is not None and not decision.compete
                and decision.refusal is not None):
            self._status.say_refusal(self._body, group.epoch, decision)
        if report.streaming and group.active is not None:
            await self._standby.warm_up(self.cell, group.epoch + 1)
        await self.publish(report)

    # -- old primary -------------------------------------------------------------

    async def _retire_step(self, group: GroupView) -> None:
        # Fencing is for good: decide it on a fresh read, never on a view that may be stale.
        try:
            group = await OwnershipTable(self._ctx.store).read_group(self.cell.name)
        except CellplaneError as error:
            log.warning("%s: cannot confirm who is active: %s", self.site.name, error)
            return
        active = group.active
        if self.holder.state.role is Role.OWNER or active is None \
                or active.region == self._ctx.region:
            return
        self._primary.forget_database()
        self._standby.cooled()  # the fence ended every process but Postgres
        message = await self._retirement.step(self._body, active.region, active.epoch)
        await self.publish(SiteReport(role="old-primary", site=self.site.name, message=message))

    # -- shared ----------------------------------------------------------------

    async def publish(self, report: SiteReport) -> None:
        if report == self._last_report:
            return
        try:
            await self._ctx.reports.publish(self.cell.name, self._ctx.region, report)
            self._last_report = report
        except CellplaneError as error:
            log.warning("%s: cannot publish the site report: %s", self.site.name, error)

    def remove_annotations(self, keys: list[str]) -> None:
        """Removes these of the Cell's annotations, beside the site's work (retried)."""
        present = {key: None for key in keys if self.annotation(key) is not None}
        if not present:
            return
        patch: dict[str, Any] = {"metadata": {"annotations": present}}
        self._kube_writes.offer(
            "annotations", lambda: self._ctx.kube.patch(CELLS, self.cell.name, patch))

    async def _pause(self, stop: asyncio.Event) -> None:
        await first_of(stop, self._wake, timeout=self._ctx.settings.site_check_seconds)

    async def destroy(self) -> None:
        """The cell is gone: remove this region's site and its report."""
        standby_gone(self.cell.name, self._ctx.region)
        with contextlib.suppress(CellplaneError):
            await self._ctx.driver.destroy(self.site)
        with contextlib.suppress(CellplaneError):
            await self._ctx.reports.withdraw(self.cell.name, self._ctx.region)
        self._standby.forget()

