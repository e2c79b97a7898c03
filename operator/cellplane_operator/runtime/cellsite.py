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
it. Winning starts ``start_acting``, which promotes a standby first. A planned
switchover is run by the owner (``runtime/handover.py``).

A fence a person put on the Cell (``domain/fencing.py``) is kept by whichever
site is primary: the database grant gives no write time while the annotation
stands (``CellDatabaseGrant`` reads it at every grant), the workers are stopped,
the API keeps answering (reads work, writes are refused by the database), and
the lease is held all along, so nobody takes the cell over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cellplane_operator.aio import first_of
from cellplane_operator.domain.cells import (
    CellObservation,
    StandbyReport,
    plan_cell_status,
    plan_refused_failover,
)
from cellplane_operator.domain.failover import (
    FORCE_FAILOVER,
    SWITCHOVER_TO,
    ActiveSite,
    Candidacy,
    SiteRole,
    StandbyWitness,
    TakeoverRecord,
    WitnessRecord,
    candidacy,
    lag_at_loss,
    restored_witness,
    site_role,
    witness_record,
    witnessed,
)
from cellplane_operator.domain.conditions import find_condition
from cellplane_operator.domain.fencing import ManualFence, fence_event, requested_fence
from cellplane_operator.domain.ownership import Role, database_grant
from cellplane_operator.domain.primary_site import (
    PrimaryProcesses, must_start_serving, status_write_due, worker_processes,
)
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS
from cellplane_operator.metrics import standby_gone, standby_observed, takeover_served
from cellplane_operator.ownership import LeaseHolder, OwnershipTable
from cellplane_operator.ownership.cell_grant import CellDatabaseGrant
from cellplane_operator.ownership.holder import HolderIdentity
from cellplane_operator.ownership.table import GroupView
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.handover import PlannedHandover
from cellplane_operator.runtime.kubewrites import PendingWrites
from cellplane_operator.runtime.retire import OldPrimaryRetirement
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
        self._wake = asyncio.Event()
        self._epoch: int | None = None
        self._fenced = False
        self._grant: CellDatabaseGrant | None = None
        self._database: DatabaseEndpoint | None = None
        self._holder: LeaseHolder | None = None
        self._group: GroupView | None = None
        self._problem = ""
        self._last_status: dict[str, Any] | None = None
        self._last_status_at = 0.0
        self._last_report: SiteReport | None = None
        self._detaching = False
        self._witness = StandbyWitness()
        self._refusal_said: tuple[int, str] | None = None
        self._takeover: dict[str, Any] | None = None
        """Set by ``start_acting`` when this site took the epoch from another; made a record
        (``_took_over``) once serving."""
        self._took_over: TakeoverRecord | None = None
        """The takeover that gave this site its epoch: in the Cell's status (``lastTakeover``)
        and in this site's report in etcd, where a restarted operator finds it again."""
        self._took_over_said: int | None = None
        self._kube_writes = PendingWrites(self.site.name)
        """Status and annotations, written beside the site's work: nothing from losing a
        lease to serving and routing waits on the Kubernetes API."""
        self._restored = False
        self._serving_epoch: int | None = None
        self._serving_workers: int | None = None
        self._granted_epoch: int | None = None
        self._warm_epoch: int | None = None
        self._handover = PlannedHandover(ctx, self)
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
        assert self._grant is not None
        return self._grant

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
            HolderIdentity(self.cell.name, self._ctx.region, self.site.name), self,
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
            holder.compete = self._database is not None or database_role == "primary"
            await self._primary_step(group)
        elif role is SiteRole.PROMOTING:
            holder.compete = True
            await self._promoting_step()
        elif role is SiteRole.HANDED_OVER:
            # The successor has HANDOVER_PATIENCE to take the epoch; if it does not, this
            # holder takes it back and start_acting restarts the demoted database.
            holder.compete = True
            await self._publish(SiteReport(role="primary", site=self.site.name,
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
        if own is not None and own.took_over is not None and own.epoch == own.took_over.epoch:
            self._took_over = own.took_over
            self._took_over_said = None
        try:
            record = WitnessRecord.decode(self._witness_file.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            log.warning("%s: ignoring the standby witness %s: %s", self.site.name,
                        self._witness_file, error)
            return
        self._witness = restored_witness(record, monotonic_now=self._ctx.clock.monotonic(),
                                         wall_now=self._ctx.clock.now().timestamp())
        log.info("%s: the previous operator saw this standby streaming (lag %.1fs) until %s",
                 self.site.name, record.lag_while_streaming,
                 record.not_streaming_since or record.last_streaming_at)

    @property
    def _witness_file(self) -> Path:
        return Path(self._ctx.settings.state_dir) / "witness" / f"{self.site.name}.json"

    def _keep_witness(self, witness: StandbyWitness) -> None:
        """Written at each change (a rename: never half a file), so that an operator
        restarted during a region loss judges the standby as this one would have."""
        if witness == self._witness:
            return
        self._witness = witness
        record = witness_record(witness, monotonic_now=self._ctx.clock.monotonic(),
                                wall_now=self._ctx.clock.now().timestamp())
        path = self._witness_file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_bytes(record.encode())
            os.replace(temporary, path)
        except OSError as error:
            log.warning("%s: cannot keep the standby witness: %s", self.site.name, error)

    def _active(self, group: GroupView) -> ActiveSite | None:
        """The active site; our own holder's word first, since the group it last read may
        predate the acquisition it just won."""
        state = self.holder.state
        if state.role is Role.OWNER and state.epoch is not None:
            return ActiveSite(self._ctx.region, self.site.name, state.epoch)
        return group.active

    # -- primary ---------------------------------------------------------------

    async def _primary_step(self, group: GroupView) -> None:
        try:
            token = await self._ctx.cell_admin_token(self.cell.name)
            if self._database is None:
                self._database = await self._ctx.driver.ensure_primary_database(self.site)
        except CellplaneError as error:
            self._problem = f"could not start the primary database: {error}"[:1000]
            log.warning("%s: %s", self.site.name, self._problem)
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
        # routers follow. Status and Events are written beside it (``_kube_writes``).
        await self._publish(SiteReport(
            role="primary", site=self.site.name, database=self._database,
            endpoints=health.endpoints, serving=serving, epoch=epoch,
            message=self._problem, took_over=self._current_takeover()))
        await self._report_cell_status(health, serving)
        if serving and epoch is not None:
            # A request naming this region is done once it serves; left standing, a forced
            # failover would keep this standby's lag out of every later decision.
            self.remove_annotations([key for key in (FORCE_FAILOVER, SWITCHOVER_TO)
                                      if self.annotation(key) == self._ctx.region])
            target = self.annotation(SWITCHOVER_TO)
            if target is not None and target != self._ctx.region:
                await self._handover.run(target, epoch, group)

    async def _promoting_step(self) -> None:
        """This site won the epoch while its database is a standby: ``start_acting``
        promotes it; if that failed, it is tried again here."""
        holder = self.holder
        if holder.state.role is Role.OWNER and self._epoch is not None:
            try:
                await self._become_primary()
            except CellplaneError as error:
                self._problem = f"could not promote the standby: {error}"[:1000]
                log.error("%s: %s", self.site.name, self._problem)
        await self._publish(SiteReport(role="standby", site=self.site.name,
                                       message="taking over: promoting this standby"))

    async def _become_primary(self) -> DatabaseEndpoint:
        """Promotes the site's standby (and checkpoints it) if it is one; starts a demoted
        database again; returns the primary database."""
        if await self._ctx.driver.database_role(self.site) == "standby":
            await self._ctx.driver.promote_database(self.site)
        database = await self._ctx.driver.ensure_primary_database(self.site)
        self._database = database
        if self._grant is None or self._grant.conninfo != database.conninfo:
            self._grant = CellDatabaseGrant(self._ctx.databases, database.conninfo,
                                            fence=lambda: self.fence)
        return database

    async def start_acting(self, epoch: int, remaining_seconds: float) -> None:
        started = self._ctx.clock.monotonic()
        previous = self._group.active if self._group is not None else None
        gone_since = self.holder.vacated_at
        was_standby = await self._ctx.driver.database_role(self.site) == "standby"
        # Set first: if the promotion fails, the promoting step tries it again under it.
        self._epoch, self._fenced = epoch, False
        await self._become_primary()
        standby_gone(self.cell.name, self._ctx.region)
        if was_standby:
            self._takeover = {
                "fromRegion": previous.region if previous is not None else None,
                "planned": self._group is not None and self._group.handover is not None,
                "since": gone_since if gone_since is not None else started,
                "promotedIn": self._ctx.clock.monotonic() - started}
        # If this grant fails, the next renewal writes it, and the processes wait for it.
        remaining = remaining_seconds - (self._ctx.clock.monotonic() - started)
        try:
            await self.grant.start_acting(epoch, max(remaining, 0.0))
            self._granted_epoch = epoch
        finally:
            self._wake.set()

    async def renew_grant(self, epoch: int, remaining_seconds: float) -> None:
        if self._handover.in_progress or self._grant is None:
            # The handover ended the grant on purpose and a renewal must not revive it;
            # or the promotion failed, and the promoting step grants once it succeeds.
            return
        await self._grant.renew_grant(epoch, remaining_seconds)
        if self._granted_epoch != epoch:
            self._granted_epoch = epoch
            self._wake.set()

    async def stop_acting(self, epoch: int, reason: str) -> None:
        self._epoch = None
        if self._detaching:
            log.info("%s: leaving epoch %d serving for the next operator to adopt",
                     self.site.name, epoch)
            return
        self._fenced = self._holder is not None and self._holder.state.role is Role.FENCED
        self._wake.set()
        if self._handover.in_progress:
            return  # the handover already ended the grant; it stops the processes itself
        if self._grant is not None:
            await self._grant.stop_acting(epoch, reason)
        try:
            await self._ctx.driver.stop_serving(self.site)
        except CellplaneError as error:
            log.error("%s: could not stop serving: %s", self.site.name, error)

    async def _keep_fence(self, epoch: int) -> None:
        """A fence put on or lifted reaches the database now, not at the next renewal: a
        grant of the lease's remaining time, which the fence (if it stands) makes zero."""
        grant, holder = self._grant, self.holder
        if (grant is None or grant.fenced_by == self.fence or self._handover.in_progress
                or holder.state.role is not Role.OWNER or holder.state.epoch != epoch):
            return
        remaining = database_grant(holder.state, now=self._ctx.clock.monotonic(),
                                   settings=self.cell.lease)
        if remaining <= 0:
            return  # the watchdog stops the work (a zero grant); nothing to open
        try:
            await grant.renew_grant(epoch, remaining)
        except CellplaneError as error:
            # The next renewal grants under the fence as it then stands.
            log.warning("%s: could not apply the fence to the database grant: %s",
                        self.site.name, error)

    def _workers(self) -> int:
        in_force = self._grant.fenced_by if self._grant is not None else None
        return worker_processes(configured=self.cell.worker_processes,
                                fence_asked=self.fence is not None,
                                fence_in_force=in_force is not None)

    async def _start_serving(self, epoch: int, token: str) -> SiteHealth | None:
        workers = self._workers()
        spec = ServingSpec(epoch=epoch, admin_token=token,
                           worker_processes=workers,
                           slots_per_worker=self.cell.slots_per_worker,
                           allow_private_targets=self.cell.allow_private_targets)
        try:
            await self._ctx.driver.start_serving(self.site, spec)
        except CellplaneError as error:
            self._problem = str(error)
            await self._ctx.event(self._body, "Warning", "StartFailed", str(error))
            return None
        self._problem = ""
        self._serving_epoch, self._serving_workers = epoch, workers
        await self._ctx.event(self._body, "Normal", "Serving",
                              f"cell API and {spec.worker_processes} worker process(es) of "
                              f"{self.site.name} serve under epoch {epoch}")
        return await self._check()

    def _record_takeover(self, epoch: int) -> None:
        """Once, when a site that took the epoch from another serves: the record the Cell's
        status and an Event carry (written by ``_report_cell_status``, when they can be)."""
        takeover, self._takeover = self._takeover, None
        if takeover is None:
            return
        seconds = self._ctx.clock.monotonic() - takeover["since"]
        takeover_served(self.cell.name, self._ctx.region, planned=bool(takeover["planned"]),
                        seconds=seconds, promoted_in=float(takeover["promotedIn"]))
        self._took_over = TakeoverRecord(
            epoch=epoch, from_region=takeover["fromRegion"], to_region=self._ctx.region,
            planned=bool(takeover["planned"]), seconds=seconds,
            promoted_in=float(takeover["promotedIn"]), at=_timestamp(self._ctx.clock.now()))

    def _current_takeover(self) -> TakeoverRecord | None:
        record = self._took_over
        return record if record is not None and record.epoch == self._epoch else None

    async def _said_took_over(self, record: TakeoverRecord) -> None:
        """The status shows the takeover: its Event, and the one-shot annotations that
        asked for it removed."""
        if self._took_over_said == record.epoch:
            return
        self._took_over_said = record.epoch
        await self._ctx.event(self._body, "Normal", "TookOver", record.event_message(self.site.name))
        self.remove_annotations([FORCE_FAILOVER, SWITCHOVER_TO])

    def remove_annotations(self, keys: list[str]) -> None:
        """Removes these of the Cell's annotations, beside the site's work (retried)."""
        present = {key: None for key in keys if self.annotation(key) is not None}
        if not present:
            return
        patch: dict[str, Any] = {"metadata": {"annotations": present}}
        self._kube_writes.offer(
            "annotations", lambda: self._ctx.kube.patch(CELLS, self.cell.name, patch))

    async def _report_cell_status(self, health: SiteHealth, serving: bool) -> None:
        others = tuple(r for r in self.cell.site_regions if r != self._ctx.region)
        reports: dict[str, SiteReport] = {}
        if others:  # an etcd read a second per cell, only where it tells something
            try:
                reports = await self._ctx.reports.read_cell(self.cell.name)
            except CellplaneError as error:
                log.warning("%s: cannot read standby reports: %s", self.site.name, error)
                return
        standbys = tuple(
            StandbyReport(region, report.role == "standby" and report.streaming,
                          report.lag_seconds, report.message)
            for region, report in reports.items() if region in others)
        current = (self._body.get("status") or {})
        observed = CellObservation(
            generation=int(self._body["metadata"].get("generation", 0)),
            active_region=self._ctx.region, active_site=self.site.name, epoch=self._epoch,
            fenced=self._fenced, database_up=health.database_up, serving=serving,
            api_endpoint=health.endpoints.api if health.endpoints and serving else None,
            admin_endpoint=health.endpoints.admin if health.endpoints and serving else None,
            draining=self.cell.draining, standby_regions=others,
            standbys=standbys, max_standby_lag_seconds=self.cell.max_standby_lag_seconds,
            previous_phase=current.get("phase"), problem=self._problem, fence=self.fence,
            fence_in_force=self._grant.fenced_by if self._grant is not None else None)
        status = plan_cell_status(observed, current_conditions=current.get("conditions") or [],
                                  now=self._ctx.clock.now())
        took_over = self._current_takeover()
        if took_over is not None:
            # Level-triggered: in every status of this epoch, so a write that failed (the
            # apiserver away) is made again, and a restarted operator makes it too.
            status["lastTakeover"] = took_over.to_status()
        now = self._ctx.clock.monotonic()
        if not status_write_due(status, self._last_status,
                                seconds_since_last=now - self._last_status_at,
                                refresh_seconds=_STATUS_REFRESH_SECONDS):
            return
        before = (self._last_status or current).get("phase")
        recorded = find_condition(self._last_status or current, "Fenced")
        shown = (current.get("lastTakeover") or {}).get("epoch")

        async def written() -> None:
            if took_over is not None and shown != took_over.epoch:
                await self._said_took_over(took_over)

        self._offer_status(status, then=written)
        self._last_status, self._last_status_at = status, now
        said = fence_event(recorded, find_condition(status, "Fenced"), cell=self.cell.name)
        if said is not None:
            await self._ctx.event(self._body, said.type, said.reason, said.message)
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        # A fence a person put on has its own Fenced / Unfenced Events (above).
        if status["phase"] != before and ready["reason"] != "FencedByUser":
            await self._ctx.event(self._body, "Warning" if status["phase"] in
                                  ("Degraded", "Fenced") else "Normal",
                                  f"Phase{status['phase']}", ready["message"])

    def _offer_status(self, status: dict[str, Any], *,
                      then: Callable[[], Awaitable[None]] | None = None) -> None:
        """The Cell's status as this site sees it now, written when the apiserver takes it
        (a later one replaces it if it was not written yet); ``then`` runs once it was."""
        patch = {"status": status}
        self._kube_writes.offer(
            "status", lambda: self._ctx.kube.patch(CELLS, self.cell.name, patch,
                                                   subresource="status"), then=then)

    # -- standby ---------------------------------------------------------------

    async def _standby_step(self, group: GroupView) -> None:
        active_region = group.active.region if group.active is not None else self.cell.region
        report = await self._follow(active_region)
        decision = self._candidacy(group, active_region)
        # Until a site has held the epoch once, the cell is new: its home site starts it.
        self.holder.compete = decision.compete and group.active is not None
        if (group.owner is None and group.active is not None and not decision.compete
                and decision.refusal is not None):
            await self._say_refusal(group.epoch, decision)
        if report.streaming and group.active is not None:
            await self._warm_up(group.epoch + 1)
        await self._publish(report)

    async def _warm_up(self, epoch: int) -> None:
        """Keeps this standby's API started under the epoch a takeover by it would raise
        the group to, so that serving after a promotion needs no new process."""
        if self._warm_epoch == epoch:
            return
        try:
            spec = ServingSpec(epoch=epoch,
                               admin_token=await self._ctx.cell_admin_token(self.cell.name),
                               worker_processes=self.cell.worker_processes,
                               slots_per_worker=self.cell.slots_per_worker,
                               allow_private_targets=self.cell.allow_private_targets)
            await self._ctx.driver.warm_up(self.site, spec)
            self._warm_epoch = epoch
        except CellplaneError as error:
            log.warning("%s: could not warm up the API: %s", self.site.name, error)

    async def _follow(self, active_region: str) -> SiteReport:
        """Keeps this site a streaming standby of the active site; its report."""
        try:
            primary = await self._ctx.reports.read(self.cell.name, active_region)
            if primary is None or primary.database is None or primary.role != "primary":
                return SiteReport(role="standby", site=self.site.name,
                                  message=f"waiting for the primary site in {active_region}")
            database = await self._ctx.driver.ensure_standby_database(self.site, primary.database)
            health = await self._ctx.driver.check(self.site)
        except CellplaneError as error:
            return SiteReport(role="standby", site=self.site.name, message=str(error)[:500])
        if health.restarted:
            await self._ctx.event(self._body, "Warning", "ProcessRestarted",
                                  f"{self.site.name}: restarted {', '.join(health.restarted)}")
        self._keep_witness(witnessed(self._witness, now=self._ctx.clock.monotonic(),
                                     streaming=health.streaming,
                                     lag_seconds=health.replay_lag_seconds))
        standby_observed(self.cell.name, self._ctx.region, streaming=health.streaming,
                         lag_seconds=health.replay_lag_seconds)
        message = "" if health.streaming else f"not streaming from the primary in {active_region}"
        return SiteReport(role="standby", site=self.site.name, database=database,
                          streaming=health.streaming, lag_seconds=health.replay_lag_seconds,
                          message=message)

    def _candidacy(self, group: GroupView, active_region: str) -> Candidacy:
        lag = lag_at_loss(self._witness, now=self._ctx.clock.monotonic(),
                          owner_gone_at=self.holder.state.gone_since if group.owner is None else None,
                          lease_seconds=self.cell.lease.duration_seconds)
        return candidacy(my_region=self._ctx.region, active_region=active_region,
                         automatic=self.cell.automatic_failover,
                         forced_region=self.annotation(FORCE_FAILOVER), lag_seconds=lag,
                         max_lag_seconds=self.cell.max_standby_lag_seconds)

    async def _say_refusal(self, epoch: int, decision: Candidacy) -> None:
        assert decision.refusal is not None
        said = (epoch, decision.refusal)
        if self._refusal_said == said:
            return
        current = self._body.get("status") or {}
        status = plan_refused_failover(
            generation=int(self._body["metadata"].get("generation", 0)),
            reason=decision.refusal, message=decision.message,
            current_conditions=current.get("conditions") or [], now=self._ctx.clock.now())

        async def written() -> None:
            if self._refusal_said != said:
                self._refusal_said = said
                await self._ctx.event(self._body, "Warning", "FailoverRefused", decision.message)

        self._offer_status(status, then=written)

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
        self._database = None
        self._warm_epoch = None  # the fence ended every process but Postgres
        message = await self._retirement.step(self._body, active.region, active.epoch)
        await self._publish(SiteReport(role="old-primary", site=self.site.name, message=message))

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
        await first_of(stop, self._wake, timeout=self._ctx.settings.site_check_seconds)

    async def destroy(self) -> None:
        """The cell is gone: remove this region's site and its report."""
        standby_gone(self.cell.name, self._ctx.region)
        with contextlib.suppress(CellplaneError):
            await self._ctx.driver.destroy(self.site)
        with contextlib.suppress(CellplaneError):
            await self._ctx.reports.withdraw(self.cell.name, self._ctx.region)
        self._witness_file.unlink(missing_ok=True)


def _timestamp(moment: Any) -> str:
    return str(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))
