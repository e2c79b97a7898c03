"""The placement leader's controller: tenants placed, provisioned in their cells, and removed.

Runs only while this operator holds the placement election. Each reconcile of
a tenant reads (the Tenant, its placement record, its cell), plans (pure
placement and status, ``domain/placement.py`` and ``domain/tenants.py``), acts
(the etcd record first, ``runtime/placing.py``; then the Secret, the cell's admin
API and a dedicated tenant's own cell, ``runtime/provisioning.py``; all
idempotent) and reports (status, conditions, Events). A crash at any point leaves
either no record (nothing was done) or a record that the next reconcile continues
from: a tenant is never placed twice.

The Cells' side of the same leader (acceptance, loads, the deletion guard) is
``runtime/cells.py``; this controller starts it once it has read the records.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from cellplane_cells.domain.plans import Quotas

from cellplane_operator.aio import first_of, running
from cellplane_operator.api.v1alpha1 import TenantStatus
from cellplane_operator.domain.cells import Tier
from cellplane_operator.domain.fencing import requested_fence
from cellplane_operator.domain.placement import CellCandidate
from cellplane_operator.domain.routing import key_digest
from cellplane_operator.domain.tenants import (
    ForgetSaid, MoveSeen, SayProgress, TenantCell, TenantPhase, TenantProgress,
    WaitForTenantCell, moves_under_way, name_problem, plan_tenant_status, progress_news,
    provisioned_event, provisioning_cell, provisioning_failed, purges_data, record_update_due,
    refused_by_cell, removal_cell, removed_message, RemoveFrom,
)
from cellplane_operator.errors import CellApiError, CellplaneError
from cellplane_operator.failpoints import failpoint
from cellplane_operator.kube import TENANTS
from cellplane_operator.ownership.election import Leadership, NotLeaderError
from cellplane_operator.placement.records import PlacementRecord, Stored, TenantKey
from cellplane_operator.runtime.cells import CellController
from cellplane_operator.runtime.context import FINALIZER, RegionContext
from cellplane_operator.runtime.objects import CellObject, TenantObject
from cellplane_operator.runtime.placing import Placements
from cellplane_operator.runtime.provisioning import (
    ApiKeys, DedicatedCells, TenantSecrets, provision, secret_name,
)
from cellplane_operator.runtime.specs import TenantSettings
from cellplane_operator.runtime.workqueue import WorkQueue

__all__ = ["TenantController"]

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 30.0

Applied = tuple[int, str, int, bool]
"""What a provisioning carried to the cell: the generation, the cell, the record's epoch
and the cell's URL policy. The same again needs no call to the cell."""


class TenantController:
    def __init__(self, ctx: RegionContext, leadership: Leadership, *,
                 placements: Placements, cells: CellController) -> None:
        self._ctx = ctx
        self._leadership = leadership
        self._placements = placements
        self._cells = cells
        self._secrets = TenantSecrets(ctx)
        self._dedicated = DedicatedCells(ctx, placements, cells.publish_load)
        self._queue: WorkQueue[TenantKey] = WorkQueue(
            self._reconcile, first_retry_seconds=1.0,
            retry_ceiling_seconds=_MAX_BACKOFF_SECONDS, ignored=(NotLeaderError,))
        self._provisioned: dict[TenantKey, Applied] = {}
        self._announced: dict[TenantKey, str] = {}
        placements.record_changed.append(self.tenant_changed)

    # -- scheduling --------------------------------------------------------------------

    def tenant_changed(self, key: TenantKey) -> None:
        self._queue.changed(key)

    def cell_changed(self, name: str, before: CellObject | None,
                     cell: CellObject | None) -> None:
        """A cell's state moved: its tenants and every unplaced tenant may move on now.

        Only a change that placement or provisioning depends on (spec, phase,
        endpoints, deletion) wakes the tenants: a cell's status also changes with
        every standby lag reading, and waking thousands of tenants for that would
        be all cost and no effect."""
        if before is not None and cell is not None and _placement_view(before) == _placement_view(cell):
            return
        for key in self._placements.tenants_in(name):
            self._queue.add(key)
        for key in list(self._ctx.cache.tenants):
            if not self._placements.placed(key):
                self._queue.add(key)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not self._leadership.leading:
                await first_of(stop, self._leadership.changed)
                self._leadership.changed.clear()
                continue
            await self._lead(stop)

    async def _lead(self, stop: asyncio.Event) -> None:
        try:
            placed = await self._placements.load()
        except CellplaneError as error:
            log.warning("cannot read placement records: %s", error)
            await first_of(stop, timeout=1.0)
            return
        self._provisioned.clear()
        log.info("placement leader: %d tenant(s) placed", placed)
        for key in list(self._ctx.cache.tenants):
            self._queue.add(key)
        # The cells' controller only now: its deletion guard counts the records just read.
        async with running(self._queue.run(self._ctx.settings.tenant_workers),
                           self._queue.resync_every(self._ctx.settings.resync_seconds,
                                                    lambda: self._ctx.cache.tenants),
                           self._cells.serve()):
            while not stop.is_set() and self._leadership.leading:
                self._leadership.changed.clear()
                await first_of(stop, self._leadership.changed)

    # -- one tenant: read, place, provision ----------------------------------------------

    async def _reconcile(self, key: TenantKey) -> None:
        found = self._ctx.cache.tenants.get(key)
        if found is None:
            return
        if found.meta.deleting:
            await self._remove(key, found)
            return
        try:
            tenant = TenantSettings.from_body(found.body)
            quotas = tenant.quotas()
        except (ValueError, ValidationError) as error:
            await self._report(key, found, TenantProgress(TenantPhase.UNPLACEABLE, "InvalidSpec",
                                                          str(error)))
            return
        if (problem := name_problem(tenant.name)) is not None:
            # Stored before the CRD refused such names: its Secret could never be made.
            await self._report(key, found, TenantProgress(TenantPhase.UNPLACEABLE, "InvalidName",
                                                          problem))
            return
        await self._ctx.ensure_finalizer(TENANTS, found.body, FINALIZER)
        stored = await self._placed(key, found, tenant, quotas)
        if stored is not None:
            await self._provision(key, found, tenant, quotas, stored)

    async def _placed(self, key: TenantKey, found: TenantObject, tenant: TenantSettings,
                      quotas: Quotas) -> Stored | None:
        """The tenant's record, placed now if it has none; None while it cannot be."""
        stored = self._placements.record(key)
        if stored is not None and stored.record.uid != tenant.uid:
            # A Tenant of the same name that was removed without our finalizer.
            await self._placements.delete(key, stored.record, publish_load=False)
            stored = None
        if stored is not None:
            return stored
        placed = await self._placements.place(key, found.body, tenant, quotas.max_running_jobs)
        if isinstance(placed, TenantProgress):
            await self._report(key, found, placed)
            self._queue.later(key)
            return None
        return placed

    async def _provision(self, key: TenantKey, found: TenantObject, tenant: TenantSettings,
                         quotas: Quotas, stored: Stored) -> None:
        """The placed tenant made to serve from its cell as its spec says, then reported."""
        record = stored.record
        progress = TenantProgress(TenantPhase.PROVISIONING, "CellNotReady", "", cell=record.cell,
                                  epoch=record.epoch, tenant_id=record.tenant_id, quotas=quotas)
        if tenant.isolation is Tier.DEDICATED:
            await self._dedicated.ensure(found.body, tenant, record.cell, quotas.max_running_jobs)
        cell = self._ctx.cache.cells.get(record.cell)
        where = provisioning_cell(record.cell, None if cell is None else _tenant_cell(cell))
        if isinstance(where, WaitForTenantCell):
            await self._report(key, found, replace(progress, reason=where.reason,
                                                   message=where.message))
            self._queue.later(key)
            return
        assert cell is not None
        # The cell's URL policy too: tightened, the tenant's URLs are put to it again
        # (and refused with a condition) rather than the tenant left Ready.
        applied = (tenant.generation, record.cell, record.epoch, _allows_private(cell))
        secret = secret_name(tenant)
        if self._provisioned.get(key) != applied:
            keys = await self._put_in_cell(key, found, tenant, quotas, stored,
                                           where.admin_endpoint, progress)
            if keys is None:
                return
            secret = keys.secret
            self._provisioned[key] = applied
            await self._announce_provisioned(found, tenant, record, quotas)
        await self._report(key, found, replace(
            progress, phase=TenantPhase.DEGRADED if where.degraded else TenantPhase.READY,
            reason="Provisioned", api_endpoint=cell.status.endpoints.api
            if cell.status.endpoints is not None else None,
            api_key_secret=secret, cell_degraded=where.degraded))
        # Only once its status is written too: a refused status write backs off as well.
        self._queue.done(key)

    async def _put_in_cell(self, key: TenantKey, found: TenantObject, tenant: TenantSettings,
                           quotas: Quotas, stored: Stored, admin: str,
                           progress: TenantProgress) -> ApiKeys | None:
        """The Secret, then the tenant in its cell, then the record told; the keys, or None
        when the cell refused the spec (said on the status, retried with backoff)."""
        record = stored.record
        keys = await self._secrets.ensure(found.body, tenant, record)
        failpoint("tenant-after-secret", str(key))
        try:
            await provision(self._ctx, tenant, record, admin, keys)
        except CellApiError as error:
            await self._provisioning_failed(key, found, tenant, progress, error)
            return None
        failpoint("tenant-after-provision", str(key))
        # The key's digest only now: the router checks keys with it, so the cell
        # must hold the key before the router accepts it.
        digest = key_digest(keys.api_key)
        if record_update_due(recorded_max_running_jobs=record.max_running_jobs,
                             recorded_digest=record.key_digest, max_running_jobs=quotas.max_running_jobs,
                             digest=digest):
            await self._placements.update_provisioned(key, stored, quotas.max_running_jobs, digest)
        return keys

    async def _provisioning_failed(self, key: TenantKey, found: TenantObject,
                                   tenant: TenantSettings, progress: TenantProgress,
                                   error: CellApiError) -> None:
        cell = progress.cell or ""
        failed = provisioning_failed(cell=cell, http_status=error.status, error=str(error))
        if failed is not None:
            # Unreachable, or failing on its side: said in the status as well as
            # retried with backoff, so the tenant is never left silent.
            await self._report(key, found, replace(progress, reason=failed.reason,
                                                   message=failed.message))
            raise error
        # The spec asks what the cell will not do: say which field, and wait for a change
        # of the spec or the cell (both wake the tenant) at the backoff's pace rather
        # than asking again every resync.
        refused = refused_by_cell(cell=cell, answer=_cell_answer(error), targets=tenant.targets,
                                  webhooks=[url for url, _ in tenant.webhooks])
        await self._report(key, found, replace(
            refused, cell=progress.cell, epoch=progress.epoch, tenant_id=progress.tenant_id,
            quotas=progress.quotas))
        self._queue.later(key)

    async def _announce_provisioned(self, found: TenantObject, tenant: TenantSettings,
                                    record: PlacementRecord, quotas: Quotas) -> None:
        """An Event when the tenant first serves in its cell or its quotas changed; none
        when a new leader merely provisions again what its predecessor had."""
        reason = provisioned_event(_wire(found.status), cell=record.cell,
                                   generation=tenant.generation)
        if reason is None:
            return
        await self._ctx.event(found.body, "Normal", reason,
                              f"tenant {record.tenant_id} in cell {record.cell}: "
                              f"{quotas.max_running_jobs} running, {quotas.jobs_per_second:g} jobs/s, "
                              f"burst {quotas.burst} (generation {tenant.generation})")

    # -- one tenant: removal ---------------------------------------------------------------

    async def _remove(self, key: TenantKey, found: TenantObject) -> None:
        if FINALIZER not in found.meta.finalizers:
            return
        tenant = TenantSettings.from_body(found.body)
        if moving := self._moves_under_way(key, described=False):
            # The move sees the deletion and aborts (or, past its commit, finishes):
            # removing the tenant from a cell it is leaving would race the copy.
            await self._report(key, found, TenantProgress(
                TenantPhase.DELETING, "MoveInProgress",
                f"waiting for TenantMove {', '.join(moving)} to end before removing the tenant"))
            self._queue.later(key)
            return
        purge = purges_data(tenant.deletion_policy)
        stored = self._placements.record(key)
        if stored is not None and not await self._leave_cell(key, found, stored.record, purge):
            return
        if tenant.isolation is Tier.DEDICATED and purge:
            await self._dedicated.delete_for(tenant)
        await self._secrets.delete(tenant)
        await self._ctx.drop_finalizer(TENANTS, found.body, FINALIZER)
        self._provisioned.pop(key, None)
        self._announced.pop(key, None)

    async def _leave_cell(self, key: TenantKey, found: TenantObject, record: PlacementRecord,
                          purge: bool) -> bool:
        """The tenant out of its cell and its record gone; False while the cell cannot be
        asked (said on the status, retried with backoff)."""
        cell = self._ctx.cache.cells.get(record.cell)
        where = removal_cell(record.cell, None if cell is None else _tenant_cell(cell))
        if isinstance(where, WaitForTenantCell):
            await self._report(key, found, TenantProgress(
                TenantPhase.DELETING, where.reason, where.message, cell=record.cell,
                epoch=record.epoch, tenant_id=record.tenant_id))
            self._queue.later(key)
            return False
        if isinstance(where, RemoveFrom):
            token = await self._ctx.cell_admin_token(record.cell)
            await self._ctx.cells.delete_tenant(where.admin_endpoint, token, record.tenant_id,
                                                purge=purge)
        await self._placements.delete(key, record)
        await self._ctx.event(found.body, "Normal", "Removed", removed_message(
            cell=record.cell, tenant_id=record.tenant_id, purge=purge))
        return True

    # -- reporting ---------------------------------------------------------------------

    def _moves_under_way(self, key: TenantKey, *, described: bool) -> list[str]:
        moves = (MoveSeen(name=name, tenant=move.spec.tenant if move.spec is not None else None,
                          phase=move.status.phase, target_cell=move.status.target_cell)
                 for (namespace, name), move in self._ctx.cache.moves.items()
                 if namespace == key.namespace)
        return moves_under_way(key.name, moves, described=described)

    async def _report(self, key: TenantKey, found: TenantObject, progress: TenantProgress) -> None:
        if progress.moving is None and (moves := self._moves_under_way(key, described=True)):
            progress = replace(progress, moving="; ".join(moves))
        current = found.status
        status = TenantStatus.model_validate(plan_tenant_status(
            progress, generation=found.meta.generation,
            current_conditions=[c.model_dump(mode="json", by_alias=True, exclude_unset=True)
                                for c in current.conditions or ()],
            now=self._ctx.clock.now()))
        if all(getattr(current, field) == getattr(status, field)
               for field in status.model_fields_set):
            return
        await self._ctx.kube.patch(TENANTS, found.meta.name, {"status": _wire(status)},
                                   namespace=found.meta.namespace, subresource="status")
        news = progress_news(progress, said_before=self._announced.get(key))
        if isinstance(news, SayProgress):
            self._announced[key] = news.said
            await self._ctx.event(found.body, news.type, progress.reason, progress.message)
        elif isinstance(news, ForgetSaid):
            self._announced.pop(key, None)

    # -- what the move controller shares ------------------------------------------------

    def record(self, key: TenantKey) -> Stored | None:
        """The tenant's placement record as this leader last read or wrote it."""
        return self._placements.record(key)

    async def refresh(self, key: TenantKey, *, reconcile: bool = True) -> Stored | None:
        """The record as etcd holds it now, remembered; the tenant is reconciled again."""
        return await self._placements.refresh(key, reconcile=reconcile)

    async def replace_record(self, key: TenantKey, stored: Stored, record: PlacementRecord) -> Stored:
        """Compare-and-swap of the record (``Placements.replace_record``)."""
        return await self._placements.replace_record(key, stored, record)

    def candidates(self) -> list[CellCandidate]:
        return self._placements.candidates()

    async def ensure_dedicated_cell(self, body: dict[str, Any], tenant: TenantSettings,
                                    cell: str, max_running_jobs: int, region: str,
                                    like: dict[str, Any] | None) -> None:
        await self._dedicated.ensure(body, tenant, cell, max_running_jobs, region=region, like=like)

    async def delete_unused_cell(self, name: str) -> bool:
        """Deletes a cell no placement record points at; True if a deletion was asked."""
        return await self._dedicated.delete_unused(name)


def _wire(status: TenantStatus) -> dict[str, Any]:
    """The status as the merge patch carries it: camelCase, and only the fields the plan
    set, so that the fields it leaves out are left as they are."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _cell_answer(error: CellApiError) -> str:
    """The cell's own words for a refusal (its message and code), else the whole error."""
    return f"{error.detail} ({error.code})" if error.detail else str(error)


def _tenant_cell(cell: CellObject) -> TenantCell:
    endpoints = cell.status.endpoints
    admin = endpoints.admin if endpoints is not None else None
    return TenantCell(phase=cell.status.phase, admin_endpoint=admin or None,
                      fence=requested_fence(cell.meta.annotations))


def _allows_private(cell: CellObject) -> bool:
    return cell.spec is not None and cell.spec.driver.allow_private_targets


def _placement_view(cell: CellObject) -> tuple[Any, ...]:
    status = cell.status
    return (cell.spec, cell.spec_problem, status.phase, status.endpoints, status.tenants,
            status.slots_in_use, cell.meta.deleting)
