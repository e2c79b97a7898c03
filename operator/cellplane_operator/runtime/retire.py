"""An old primary after another site took its cell: fence it, report what it alone had,
rebuild it as a standby of the new primary. Each step is idempotent and the
order is the point:

1. fence (pg_hba rejecting, sessions terminated, stopped, never restarted by a
   health check) unless it is already down for good (fenced, or demoted by a
   planned switchover);
2. the reconciliation report: what the old primary committed past the point
   the new primary's timeline began, read from the old data started where only
   this operator reaches it, stored as a file and a ConfigMap, summarised in
   the Cell's status and an Event. It is made before the rewind because the
   rewind throws that data away; nothing is rebuilt without it;
3. pg_rewind (or a fresh base backup) into a streaming standby of the new
   primary: the cell is back to full redundancy with nobody typing a command.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from pathlib import Path
from typing import Any

from cellplane_operator.api.v1alpha1 import CellReconciliation, CellStatus
from cellplane_operator.domain.reconciliation import ReconciliationReport
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS
from cellplane_operator.lossreport.reader import build_report
from cellplane_operator.lossreport.store import ReportStore
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.sites.base import SiteKey
from cellplane_operator.sites.reports import SiteReport

__all__ = ["OldPrimaryRetirement"]

log = logging.getLogger(__name__)


class OldPrimaryRetirement:
    def __init__(self, ctx: RegionContext, site: SiteKey) -> None:
        self._ctx = ctx
        self._site = site
        self._store = ReportStore(ctx.kube, ctx.settings.namespace, self.directory)
        self._recorded: set[int] = set()
        """Epochs whose report this process put into the Cell's status and an Event."""

    @property
    def directory(self) -> Path:
        return Path(self._ctx.settings.state_dir) / "reports"

    async def step(self, body: dict[str, Any], active_region: str, epoch: int) -> str:
        """One pass; returns what the site's report should say."""
        site, driver = self._site, self._ctx.driver
        try:
            # Fenced at once: that needs nothing of the new primary.
            if await driver.database_role(site) == "primary":
                await driver.fence_database(site)
                await self._ctx.event(body, "Warning", "OldPrimaryFenced",
                                      f"{site.name} lost the cell to {active_region} (epoch "
                                      f"{epoch}): fenced (connections rejected, sessions ended, "
                                      "stopped)")
            new = await self._ctx.reports.read(site.cell, active_region)
            if new is None or new.role != "primary" or new.database is None or not new.serving:
                return f"fenced; waiting for the primary in {active_region} to serve"
            # The stored report, not a local file, says it was made: a ConfigMap that could
            # not be written is made again before the rewind throws the old data away.
            report = await self._store.get(site.cell, epoch)
            if report is None:
                report = await self._report(new, epoch)
            if epoch not in self._recorded:
                await self._record(body, report, self._store.configmap_name(site.cell, epoch))
                self._recorded.add(epoch)
            await driver.rebuild_as_standby(site, new.database)
        except CellplaneError as error:
            log.error("%s: retiring the old primary: %s", site.name, error)
            return f"old primary, not rebuilt yet: {error}"[:500]
        await self._ctx.event(body, "Normal", "RebuiltAsStandby",
                              f"{site.name} is a standby of {new.site} again")
        return ""

    async def _report(self, new: SiteReport, epoch: int) -> ReconciliationReport:
        site, driver = self._site, self._ctx.driver
        assert new.database is not None
        old = await driver.open_fenced_for_reading(site)
        try:
            report = await asyncio.to_thread(
                build_report, old, new.database.conninfo, cell=site.cell, epoch=epoch,
                old_site=site.name, new_site=new.site)
        finally:
            await driver.close_fenced_reading(site)
        name, path = await self._store.save(report)
        log.info("%s: reconciliation report %s (%s): %s", site.name, name, path, report.summary())
        return report

    async def _record(self, body: dict[str, Any], report: ReconciliationReport, name: str) -> None:
        counts = report.counts()
        recorded = CellReconciliation(
            epoch=report.epoch, report=name, jobs=counts.jobs, job_updates=counts.job_updates,
            ledger_entries=counts.ledger_entries, outbox_events=counts.outbox_events,
            tenants=counts.tenants, lost_wal_bytes=report.lost_wal_bytes,
            loss_window_seconds=report.loss_window_seconds(),
            created_at=report.created_at.astimezone(datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"))
        status = CellStatus(last_reconciliation=recorded)
        # A failure here ends the pass before the rebuild; the next pass records it again.
        await self._ctx.kube.patch(
            CELLS, self._site.cell,
            {"status": status.model_dump(mode="json", by_alias=True, exclude_unset=True)},
            subresource="status")
        lost = counts.jobs + counts.job_updates + counts.ledger_entries + counts.outbox_events
        if lost:
            message = (f"the old primary {report.old_site} had {counts.jobs} job(s), "
                       f"{counts.job_updates} job update(s), {counts.ledger_entries} "
                       f"ledger entr(ies) and {counts.outbox_events} event(s) of "
                       f"{counts.tenants} tenant(s) that {report.new_site} lacks; "
                       f"`cellplane report {self._site.cell}` prints them (ConfigMap {name})")
        else:
            message = (f"the old primary {report.old_site} had nothing that {report.new_site} "
                       f"lacks (ConfigMap {name})")
        await self._ctx.event(body, "Warning" if lost else "Normal", "ReconciliationReport",
                              message)
