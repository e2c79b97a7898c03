"""The primary's part of a cell site: the database it holds, the grant, the API and workers.

``PrimarySite`` is the lease holder's ``GroupActor``: winning the epoch
(``start_acting``) promotes a standby first, then grants the database the lease's
remaining time; each renewal extends the grant; losing the epoch (``stop_acting``)
ends the grant and stops the processes. Its step, while etcd names this site active,
keeps the database up, starts the API and workers once the grant is in, publishes the
site's report (what the routers follow), reports the Cell's status, and runs a planned
switchover when one is asked for (``runtime/handover.py``).

A fence a person put on the Cell (``domain/fencing.py``) is kept here: the database grant
gives no write time while the annotation stands (``CellDatabaseGrant`` reads it at every
grant), the workers are stopped, the API keeps answering (reads work, writes are refused
by the database), and the lease is held all along, so nobody takes the cell over.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from cellplane_operator.domain.cells import CellObservation
from cellplane_operator.domain.failover import FORCE_FAILOVER, SWITCHOVER_TO, TakeoverRecord
from cellplane_operator.domain.fencing import ManualFence
from cellplane_operator.domain.ownership import Role, database_grant
from cellplane_operator.domain.primary_site import (
    PrimaryProcesses, WorkerSetup, must_start_serving, worker_processes,
)
from cellplane_operator.errors import CellplaneError
from cellplane_operator.metrics import standby_gone, takeover_served
from cellplane_operator.ownership import LeaseHolder
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.ownership.table import GroupView
from cellplane_operator.runtime.cellstatus import CellStatusReporter, current_status
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.handover import PlannedHandover
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.sites.base import DatabaseEndpoint, SiteHealth, SiteKey
from cellplane_operator.sites.reports import SiteReport

__all__ = ["PrimarySite", "RunningSite"]

log = logging.getLogger(__name__)


class RunningSite(Protocol):
    """What the primary's part needs of the runner that runs it (``CellSiteRunner``)."""

    cell: CellSettings
    site: SiteKey

    @property
    def body(self) -> dict[str, Any]: ...

    @property
    def holder(self) -> LeaseHolder: ...

    @property
    def grant(self) -> CellDatabaseGrant: ...

    @property
    def fence(self) -> ManualFence | None: ...

    @property
    def group(self) -> GroupView | None: ...

    @property
    def detaching(self) -> bool: ...

    def annotation(self, key: str) -> str | None: ...

    def remove_annotations(self, keys: list[str]) -> None: ...

    def wake(self) -> None: ...

    async def publish(self, report: SiteReport) -> None: ...


@dataclass(frozen=True)
class _PendingTakeover:
    """What ``start_acting`` knows of a takeover by this site, until the site serves."""

    from_region: str | None
    planned: bool
    since: float
    """When the previous owner was seen gone (monotonic): the takeover's start."""
    promoted_in: float


class PrimarySite:
    def __init__(self, ctx: RegionContext, runner: RunningSite,
                 status: CellStatusReporter) -> None:
        self._ctx = ctx
        self._runner = runner
        self._site = runner.site
        self._status = status
        self._handover = PlannedHandover(ctx, runner)
        self._epoch: int | None = None
        """The epoch this site acts under; None while it does not."""
        self._fenced = False
        """The lease was lost by a self-fence (the status says Fenced)."""
        self._grant: CellDatabaseGrant | None = None
        self._database: DatabaseEndpoint | None = None
        self._problem = ""
        self._granted_epoch: int | None = None
        self._serving_epoch: int | None = None
        self._serving_workers: WorkerSetup | None = None
        self._takeover: _PendingTakeover | None = None
        """Set by ``start_acting`` when this site took the epoch from another; made a record
        (``_took_over``) once serving."""
        self._took_over: TakeoverRecord | None = None
        """The takeover that gave this site its epoch: in the Cell's status (``lastTakeover``)
        and in this site's report in etcd, where a restarted operator finds it again."""
        self._took_over_said: int | None = None

    @property
    def grant(self) -> CellDatabaseGrant | None:
        return self._grant

    @property
    def has_database(self) -> bool:
        return self._database is not None

    def forget_database(self) -> None:
        """Another site took the cell: this one's database is ensured no more."""
        self._database = None

    def restore_takeover(self, own: SiteReport | None) -> None:
        """The takeover this site's previous operator made, from the site's last report."""
        if own is not None and own.took_over is not None and own.epoch == own.took_over.epoch:
            self._took_over = own.took_over
            self._took_over_said = None

    async def step(self, group: GroupView) -> None:
        try:
            token = await self._ctx.cell_admin_token(self._runner.cell.name)
            if self._database is None:
                self._database = await self._ctx.driver.ensure_primary_database(self._site)
        except CellplaneError as error:
            self._problem = f"could not start the primary database: {error}"[:1000]
            log.warning("%s: %s", self._site.name, self._problem)
            return
        if self._epoch is not None and self._granted_epoch == self._epoch:
            await self._keep_fence(self._epoch)
        health = await self._check()
        if not health.database_up:
            # Ensured again next step, by this step's word that etcd names this site: a
            # driver's check restarts only a database it was told about (the kubernetes
            # driver's agent restarted in its Pod waits to be told).
            self._database = None
        epoch = self._epoch
        if epoch is not None and must_start_serving(PrimaryProcesses(
                epoch=epoch, granted_epoch=self._granted_epoch,
                database_up=health.database_up, running_epoch=health.epoch,
                serving_epoch=self._serving_epoch, serving_workers=self._serving_workers,
                workers=self._workers())):
            health = await self._start_serving(epoch, token) or health
        serving = health.serving and epoch is not None and health.epoch == epoch
        if serving and epoch is not None:
            self._record_takeover(epoch)
        # Published first, and nothing before it waits on Kubernetes: this is what the
        # routers follow. Status and Events are written beside it (``runtime/kubewrites.py``).
        await self._runner.publish(SiteReport(
            role="primary", site=self._site.name, database=self._database,
            endpoints=health.endpoints, serving=serving, epoch=epoch,
            message=self._problem, took_over=self._current_takeover()))
        await self._report_cell_status(health, serving)
        if serving and epoch is not None:
            # A request naming this region is done once it serves; left standing, a forced
            # failover would keep this standby's lag out of every later decision.
            self._runner.remove_annotations([
                key for key in (FORCE_FAILOVER, SWITCHOVER_TO)
                if self._runner.annotation(key) == self._ctx.region])
            target = self._runner.annotation(SWITCHOVER_TO)
            if target is not None and target != self._ctx.region:
                await self._handover.run(target, epoch, group)

    async def promoting_step(self) -> None:
        """This site won the epoch while its database is a standby: ``start_acting``
        promotes it; if that failed, it is tried again here."""
        holder = self._runner.holder
        if holder.state.role is Role.OWNER and self._epoch is not None:
            try:
                await self._become_primary()
            except CellplaneError as error:
                self._problem = f"could not promote the standby: {error}"[:1000]
                log.error("%s: %s", self._site.name, self._problem)
        await self._runner.publish(SiteReport(role="standby", site=self._site.name,
                                              message="taking over: promoting this standby"))

    async def _become_primary(self) -> DatabaseEndpoint:
        """Promotes the site's standby (and checkpoints it) if it is one; starts a demoted
        database again; returns the primary database."""
        if await self._ctx.driver.database_role(self._site) == "standby":
            await self._ctx.driver.promote_database(self._site)
        database = await self._ctx.driver.ensure_primary_database(self._site)
        self._database = database
        if self._grant is None or self._grant.conninfo != database.conninfo:
            self._grant = CellDatabaseGrant(self._ctx.databases, database.conninfo,
                                            fence=lambda: self._runner.fence)
        return database

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        started = self._ctx.clock.monotonic()
        group = self._runner.group
        previous = group.active if group is not None else None
        gone_since = self._runner.holder.vacated_at
        was_standby = await self._ctx.driver.database_role(self._site) == "standby"
        # Set first: if the promotion fails, the promoting step tries it again under it.
        self._epoch, self._fenced = epoch, False
        await self._become_primary()
        standby_gone(self._runner.cell.name, self._ctx.region)
        if was_standby:
            self._takeover = _PendingTakeover(
                from_region=previous.region if previous is not None else None,
                planned=group is not None and group.handover is not None,
                since=gone_since if gone_since is not None else started,
                promoted_in=self._ctx.clock.monotonic() - started)
        # If this grant fails, the next renewal writes it, and the processes wait for it.
        remaining = remaining_seconds - (self._ctx.clock.monotonic() - started)
        try:
            assert self._grant is not None  # made by _become_primary
            await self._grant.start_acting(epoch, max(remaining, 0.0))
            self._granted_epoch = epoch
        finally:
            self._runner.wake()

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        if self._handover.in_progress or self._grant is None:
            # The handover ended the grant on purpose and a renewal must not revive it;
            # or the promotion failed, and the promoting step grants once it succeeds.
            return
        await self._grant.renew_grant(epoch, remaining_seconds)
        if self._granted_epoch != epoch:
            self._granted_epoch = epoch
            self._runner.wake()

    async def stop_acting(self, epoch: int, reason: str) -> None:
        self._epoch = None
        if self._runner.detaching:
            log.info("%s: leaving epoch %d serving for the next operator to adopt",
                     self._site.name, epoch)
            return
        self._fenced = self._runner.holder.state.role is Role.FENCED
        self._runner.wake()
        if self._handover.in_progress:
            return  # the handover already ended the grant; it stops the processes itself
        if self._grant is not None:
            await self._grant.stop_acting(epoch, reason)
        try:
            await self._ctx.driver.stop_serving(self._site)
        except CellplaneError as error:
            log.error("%s: could not stop serving: %s", self._site.name, error)

    async def _keep_fence(self, epoch: int) -> None:
        """A fence put on or lifted reaches the database now, not at the next renewal: a
        grant of the lease's remaining time, which the fence (if it stands) makes zero."""
        grant, holder = self._grant, self._runner.holder
        if (grant is None or grant.fenced_by == self._runner.fence or self._handover.in_progress
                or holder.state.role is not Role.OWNER or holder.state.epoch != epoch):
            return
        remaining = database_grant(holder.state, now=self._ctx.clock.monotonic(),
                                   settings=self._runner.cell.lease)
        if remaining <= 0:
            return  # the watchdog stops the work (a zero grant); nothing to open
        try:
            await grant.renew_grant(epoch, remaining)
        except CellplaneError as error:
            # The next renewal grants under the fence as it then stands.
            log.warning("%s: could not apply the fence to the database grant: %s",
                        self._site.name, error)

    def _workers(self) -> WorkerSetup:
        in_force = self._grant.fenced_by if self._grant is not None else None
        cell = self._runner.cell
        return cell.workers(worker_processes(configured=cell.worker_processes,
                                             fence_asked=self._runner.fence is not None,
                                             fence_in_force=in_force is not None))

    async def _start_serving(self, epoch: int, token: str) -> SiteHealth | None:
        workers = self._workers()
        spec = self._runner.cell.serving_spec(epoch, token, workers)
        try:
            await self._ctx.driver.start_serving(self._site, spec)
        except CellplaneError as error:
            self._problem = str(error)
            await self._ctx.event(self._runner.body, "Warning", "StartFailed", str(error))
            return None
        self._problem = ""
        self._serving_epoch, self._serving_workers = epoch, workers
        await self._ctx.event(self._runner.body, "Normal", "Serving",
                              f"cell API and {workers.described()} of {self._site.name} "
                              f"serve under epoch {epoch}")
        return await self._check()

    def _record_takeover(self, epoch: int) -> None:
        """Once, when a site that took the epoch from another serves: the record the Cell's
        status and an Event carry (written by ``_report_cell_status``, when they can be)."""
        takeover, self._takeover = self._takeover, None
        if takeover is None:
            return
        seconds = self._ctx.clock.monotonic() - takeover.since
        takeover_served(self._runner.cell.name, self._ctx.region, planned=takeover.planned,
                        seconds=seconds, promoted_in=takeover.promoted_in)
        self._took_over = TakeoverRecord(
            epoch=epoch, from_region=takeover.from_region, to_region=self._ctx.region,
            planned=takeover.planned, seconds=seconds, promoted_in=takeover.promoted_in,
            at=_timestamp(self._ctx.clock.now()))

    def _current_takeover(self) -> TakeoverRecord | None:
        record = self._took_over
        return record if record is not None and record.epoch == self._epoch else None

    async def _said_took_over(self, record: TakeoverRecord) -> None:
        """The status shows the takeover: its Event, and the one-shot annotations that
        asked for it removed."""
        if self._took_over_said == record.epoch:
            return
        self._took_over_said = record.epoch
        await self._ctx.event(self._runner.body, "Normal", "TookOver",
                              record.event_message(self._site.name))
        self._runner.remove_annotations([FORCE_FAILOVER, SWITCHOVER_TO])

    async def _report_cell_status(self, health: SiteHealth, serving: bool) -> None:
        others = tuple(r for r in self._runner.cell.site_regions if r != self._ctx.region)
        standbys = await self._status.standby_reports(others)
        if standbys is None:
            return
        endpoints = health.endpoints if serving else None
        observed = CellObservation(
            generation=int(self._runner.body["metadata"].get("generation", 0)),
            active_region=self._ctx.region, active_site=self._site.name, epoch=self._epoch,
            fenced=self._fenced, database_up=health.database_up, serving=serving,
            api_endpoint=endpoints.api if endpoints else None,
            admin_endpoint=endpoints.admin if endpoints else None,
            draining=self._runner.cell.draining, standby_regions=others,
            standbys=standbys, max_standby_lag_seconds=self._runner.cell.max_standby_lag_seconds,
            previous_phase=current_status(self._runner.body).phase, problem=self._problem,
            fence=self._runner.fence,
            fence_in_force=self._grant.fenced_by if self._grant is not None else None)
        await self._status.report(self._runner.body, observed, took_over=self._current_takeover(),
                                  on_took_over_shown=self._said_took_over)

    async def _check(self) -> SiteHealth:
        try:
            health = await self._ctx.driver.check(self._site)
        except CellplaneError as error:
            self._problem = str(error)[:500]
            return SiteHealth(database_up=False, serving=False, epoch=None, endpoints=None)
        if health.restarted:
            await self._ctx.event(self._runner.body, "Warning", "ProcessRestarted",
                                  f"{self._site.name}: restarted {', '.join(health.restarted)}")
        return health


def _timestamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
