"""This region's site of one cell: the primary, which holds the cell's lease, or a standby.

Read -> plan -> act -> report, once a second and whenever something changed:
the primary's loop checks its processes (the driver restarts dead ones), starts
them under the epoch the lease holder won, publishes a site report to etcd and
writes the Cell's status from its own health and the standbys' reports. A
standby's loop keeps a streaming copy of the primary's database and reports
its lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from cellplane_operator.domain.cells import CellObservation, StandbyReport, plan_cell_status
from cellplane_operator.domain.ownership import Role
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS
from cellplane_operator.ownership import LeaseHolder, OwnershipTable
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.ownership.holder import HolderIdentity
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.sites.base import DatabaseEndpoint, ServingSpec, SiteHealth, SiteKey
from cellplane_operator.sites.reports import SiteReport

__all__ = ["CellSiteRunner"]

log = logging.getLogger(__name__)

_STATUS_REFRESH_SECONDS = 10.0
"""A status that differs only in lag numbers is written at most this often."""


class CellSiteRunner:
    def __init__(self, ctx: RegionContext, body: dict[str, Any]) -> None:
        self._ctx = ctx
        self._body = body
        self.cell = CellSettings.from_body(body)
        self.site = SiteKey(self.cell.name, ctx.region)
        self.primary = self.cell.region == ctx.region
        self._wake = asyncio.Event()
        self._epoch: int | None = None
        self._fenced = False
        self._grant: CellDatabaseGrant | None = None
        self._database: DatabaseEndpoint | None = None
        self._holder: LeaseHolder | None = None
        self._problem = ""
        self._last_status: dict[str, Any] | None = None
        self._last_status_at = 0.0
        self._last_report: SiteReport | None = None
        self._detaching = False

    def update(self, body: dict[str, Any]) -> None:
        self._body = body
        self.cell = CellSettings.from_body(body)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Runs the site until ``stop``; a bug that escapes a loop restarts it, never ends it."""
        while not stop.is_set():
            try:
                if self.primary:
                    await self._run_primary(stop)
                else:
                    await self._run_standby(stop)
            except Exception:
                log.exception("site %s failed unexpectedly; starting it over in 5s",
                              self.site.name)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 5.0)

    # -- primary ---------------------------------------------------------------

    async def _run_primary(self, stop: asyncio.Event) -> None:
        token = await self._until_done(stop, "read the cell's admin token",
                                       lambda: self._ctx.cell_admin_token(self.cell.name))
        database = await self._until_done(
            stop, "start the primary database",
            lambda: self._ctx.driver.ensure_primary_database(self.site))
        if token is None or database is None:
            return
        self._database = database
        self._grant = CellDatabaseGrant(database.conninfo)
        self._holder = LeaseHolder(
            OwnershipTable(self._ctx.store), HolderIdentity(self.cell.name, self._ctx.region,
                                                            self.site.name),
            self, settings=self.cell.lease, clock=self._ctx.clock,
            adopt_own_lease=self._ctx.settings.adopt_leases)
        holder = asyncio.create_task(self._holder.run(stop))
        try:
            await self._supervise_primary(stop, token)
        finally:
            if not stop.is_set():
                holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder
            if not self._detaching:
                with contextlib.suppress(CellplaneError):
                    await self._holder.release()

    def detach(self) -> None:
        """The operator is shutting down, not the cell: leave the site serving and the
        lease alive for the next operator of this region to adopt (or to run out)."""
        self._detaching = True

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        assert self._grant is not None
        # The epoch is ours before the grant is written: if this grant fails, the
        # next renewal writes it, and until then the database refuses the writes
        # of the processes started under it. Nothing is lost by starting early.
        self._epoch, self._fenced = epoch, False
        self._wake.set()
        await self._grant.start_acting(epoch, remaining_seconds)

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        assert self._grant is not None
        await self._grant.renew_grant(epoch, remaining_seconds)

    async def stop_acting(self, epoch: int, reason: str) -> None:
        assert self._grant is not None
        self._epoch = None
        if self._detaching:
            log.info("%s: leaving epoch %d serving for the next operator to adopt",
                     self.site.name, epoch)
            return
        self._fenced = self._holder is not None and self._holder.state.role is Role.FENCED
        await self._grant.stop_acting(epoch, reason)
        try:
            await self._ctx.driver.stop_serving(self.site)
        except CellplaneError as error:
            log.error("%s: could not stop serving: %s", self.site.name, error)
        self._wake.set()

    async def _supervise_primary(self, stop: asyncio.Event, token: str) -> None:
        while not stop.is_set():
            health = await self._check()
            epoch = self._epoch
            if epoch is not None and health.database_up and health.epoch != epoch:
                health = await self._start_serving(epoch, token) or health
            serving = health.serving and epoch is not None and health.epoch == epoch
            await self._publish(SiteReport(
                role="primary", site=self.site.name, database=self._database,
                endpoints=health.endpoints, serving=serving, epoch=epoch,
                message=self._problem))
            await self._report_cell_status(health, serving)
            await self._pause(stop)

    async def _start_serving(self, epoch: int, token: str) -> SiteHealth | None:
        spec = ServingSpec(epoch=epoch, admin_token=token,
                           worker_processes=self.cell.worker_processes,
                           slots_per_worker=self.cell.slots_per_worker,
                           allow_private_targets=self.cell.allow_private_targets)
        try:
            await self._ctx.driver.start_serving(self.site, spec)
        except CellplaneError as error:
            self._problem = str(error)
            await self._ctx.event(self._body, "Warning", "StartFailed", str(error))
            return None
        self._problem = ""
        await self._ctx.event(self._body, "Normal", "Serving",
                              f"cell API and {spec.worker_processes} worker process(es) of "
                              f"{self.site.name} serve under epoch {epoch}")
        return await self._check()

    async def _report_cell_status(self, health: SiteHealth, serving: bool) -> None:
        reports: dict[str, SiteReport] = {}
        if self.cell.standby_regions:  # an etcd read a second per cell, only where it tells something
            try:
                reports = await self._ctx.reports.read_cell(self.cell.name)
            except CellplaneError as error:
                log.warning("%s: cannot read standby reports: %s", self.site.name, error)
                return
        standbys = tuple(
            StandbyReport(region, report.streaming, report.lag_seconds, report.message)
            for region, report in reports.items() if region != self._ctx.region)
        current = (self._body.get("status") or {})
        observed = CellObservation(
            generation=int(self._body["metadata"].get("generation", 0)),
            active_region=self._ctx.region, active_site=self.site.name, epoch=self._epoch,
            fenced=self._fenced, database_up=health.database_up, serving=serving,
            api_endpoint=health.endpoints.api if health.endpoints and serving else None,
            admin_endpoint=health.endpoints.admin if health.endpoints and serving else None,
            draining=self.cell.draining, standby_regions=self.cell.standby_regions,
            standbys=standbys, max_standby_lag_seconds=self.cell.max_standby_lag_seconds,
            previous_phase=current.get("phase"), problem=self._problem)
        status = plan_cell_status(observed, current_conditions=current.get("conditions") or [],
                                  now=self._ctx.clock.now())
        now = self._ctx.clock.monotonic()
        if status == self._last_status:
            return
        if (self._last_status is not None and _without_lag(status) == _without_lag(self._last_status)
                and now - self._last_status_at < _STATUS_REFRESH_SECONDS):
            return
        before = current.get("phase")
        try:
            await self._ctx.kube.patch(CELLS, self.cell.name, {"status": status},
                                       subresource="status")
        except CellplaneError as error:
            log.warning("%s: cannot write the cell's status: %s", self.site.name, error)
            return
        self._last_status, self._last_status_at = status, now
        if status["phase"] != before:
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            await self._ctx.event(self._body, "Warning" if status["phase"] in
                                  ("Degraded", "Fenced") else "Normal",
                                  f"Phase{status['phase']}", ready["message"])

    # -- standby ---------------------------------------------------------------

    async def _run_standby(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            report = await self._standby_step()
            await self._publish(report)
            await self._pause(stop)

    async def _standby_step(self) -> SiteReport:
        try:
            primary = await self._ctx.reports.read(self.cell.name, self.cell.region)
            if primary is None or primary.database is None:
                return SiteReport(role="standby", site=self.site.name,
                                  message="waiting for the primary site's database")
            database = await self._ctx.driver.ensure_standby_database(self.site, primary.database)
            health = await self._ctx.driver.check(self.site)
        except CellplaneError as error:
            return SiteReport(role="standby", site=self.site.name, message=str(error)[:500])
        if health.restarted:
            await self._ctx.event(self._body, "Warning", "ProcessRestarted",
                                  f"{self.site.name}: restarted {', '.join(health.restarted)}")
        message = "" if health.streaming else "not streaming from the primary"
        return SiteReport(role="standby", site=self.site.name, database=database,
                          streaming=health.streaming, lag_seconds=health.replay_lag_seconds,
                          message=message)

    # -- shared ----------------------------------------------------------------

    async def _check(self) -> SiteHealth:
        try:
            health = await self._ctx.driver.check(self.site)
        except CellplaneError as error:
            self._problem = str(error)[:500]
            return SiteHealth(database_up=False, serving=False, epoch=None, endpoints=None)
        if health.restarted:
            await self._ctx.event(self._body, "Warning", "ProcessRestarted",
                                  f"{self.site.name}: restarted {', '.join(health.restarted)}")
        return health

    async def _publish(self, report: SiteReport) -> None:
        if report == self._last_report:
            return
        try:
            await self._ctx.reports.publish(self.cell.name, self._ctx.region, report)
            self._last_report = report
        except CellplaneError as error:
            log.warning("%s: cannot publish the site report: %s", self.site.name, error)

    async def _pause(self, stop: asyncio.Event) -> None:
        self._wake.clear()
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=self._ctx.settings.site_check_seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _until_done(self, stop: asyncio.Event, what: str, attempt: Any) -> Any:
        """Repeats ``attempt`` with backoff until it succeeds or the runner stops."""
        delay = 0.5
        while not stop.is_set():
            try:
                return await attempt()
            except CellplaneError as error:
                self._problem = f"could not {what}: {error}"[:1000]
                log.warning("%s: %s; again in %.1fs", self.site.name, self._problem, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 30.0)
        return None

    async def destroy(self) -> None:
        """The cell is gone: remove this region's site and its report."""
        with contextlib.suppress(CellplaneError):
            await self._ctx.driver.destroy(self.site)
        with contextlib.suppress(CellplaneError):
            await self._ctx.reports.withdraw(self.cell.name, self._ctx.region)


def _without_lag(status: dict[str, Any]) -> dict[str, Any]:
    trimmed = {k: v for k, v in status.items() if k != "standbyLagSeconds"}
    trimmed["standbys"] = [{k: v for k, v in s.items() if k != "lagSeconds"}
                           for s in status.get("standbys", [])]
    return trimmed

