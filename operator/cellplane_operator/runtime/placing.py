"""The placement leader's book of where every tenant lives: the records, and placing a tenant.

etcd's placement records (``placement/records.py``) are the only source of truth for
where a tenant lives. The leader reads them all when it starts leading and keeps them
here, changed only by its own writes (it alone writes while it leads), so that every
placement decision counts what is already placed without an etcd read per tenant.
Every write goes through the election's guard: a leader that lost the election
changes nothing.

Who listens: a record that changed wakes its tenant (``record_changed``), a cell
whose load changed has it written into its status (``load_changed``, the cell
controller).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from cellplane_operator.api.base import DNS_LABEL_PATTERN
from cellplane_operator.domain.cells import CellName, Region, Tier
from cellplane_operator.domain.placement import (
    CellCandidate, CellLoad, PlacementRequest, Unplaceable, WaitForCell, candidate_phase,
    cell_loads, place, tenant_id,
)
from cellplane_operator.domain.tenants import TenantPhase, TenantProgress
from cellplane_operator.errors import CellplaneError
from cellplane_operator.failpoints import failpoint
from cellplane_operator.ownership.election import Leadership, NotLeaderError
from cellplane_operator.placement.records import PlacementRecord, PlacementRecords, Stored, TenantKey
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.objects import CellObject
from cellplane_operator.runtime.specs import CellSettings, TenantSettings

__all__ = ["Placements", "is_dns_label"]


def is_dns_label(name: str) -> bool:
    """A name that spec.cell and a TenantMove's targetCell can hold (the CRD's pattern)."""
    return len(name) <= 63 and re.fullmatch(DNS_LABEL_PATTERN, name) is not None


class Placements:
    def __init__(self, ctx: RegionContext, leadership: Leadership) -> None:
        self._ctx = ctx
        self._leadership = leadership
        self._store = PlacementRecords(ctx.store)
        self._records: dict[TenantKey, Stored] = {}
        self._placing = asyncio.Lock()
        self._parsed_cells: dict[str, tuple[str, CellSettings]] = {}
        self.record_changed: list[Callable[[TenantKey], None]] = []
        """Called with a tenant whose record was read again after a change."""
        self.load_changed: list[Callable[[str], None]] = []
        """Called with a cell whose tenants or slots in use changed."""

    # -- reading ---------------------------------------------------------------------

    async def load(self) -> int:
        """Reads every record from etcd (a new leader's first step); how many there are."""
        self._records = await self._store.read_all()
        return len(self._records)

    def record(self, key: TenantKey) -> Stored | None:
        """The tenant's placement record as this leader last read or wrote it."""
        return self._records.get(key)

    def placed(self, key: TenantKey) -> bool:
        return key in self._records

    def tenants_in(self, cell: str) -> list[TenantKey]:
        """The tenants whose records put them in ``cell``."""
        return [key for key, stored in self._records.items() if stored.record.cell == cell]

    def load_of(self, cell: str) -> CellLoad:
        """The tenants placed in ``cell`` and the slots they may use."""
        return self._loads().get(cell, CellLoad(0, 0))

    def _loads(self) -> dict[str, CellLoad]:
        return cell_loads([(s.record.cell, s.record.max_running_jobs) for s in self._records.values()])

    async def refresh(self, key: TenantKey, *, reconcile: bool = True) -> Stored | None:
        """The record as etcd holds it now, remembered; the tenant is reconciled again."""
        stored = await self._store.read(key)
        if stored is None:
            self._records.pop(key, None)
        else:
            self._records[key] = stored
        if reconcile:
            for listener in self.record_changed:
                listener(key)
        return stored

    # -- writing ---------------------------------------------------------------------

    async def place(self, key: TenantKey, body: dict[str, Any], tenant: TenantSettings,
                    max_running_jobs: int) -> Stored | TenantProgress:
        """The tenant's record, made now if it has none (one placement at a time: each
        counts the ones before it); the tenant's progress if it cannot be placed now."""
        async with self._placing:
            if (stored := self._records.get(key)) is not None:
                return stored
            request = PlacementRequest(
                namespace=tenant.namespace, name=tenant.name, isolation=tenant.isolation,
                home_region=Region(tenant.home_region), region_policy=tenant.region_policy,
                max_running_jobs=max_running_jobs, pinned_cell=tenant.pinned_cell)
            outcome = place(request, self.candidates())
            if isinstance(outcome, Unplaceable):
                return TenantProgress(TenantPhase.UNPLACEABLE, outcome.reason, outcome.message)
            if isinstance(outcome, WaitForCell) and tenant.isolation is Tier.SHARED:
                return TenantProgress(TenantPhase.PLACING, outcome.reason, outcome.message)
            record = PlacementRecord(cell=outcome.cell, epoch=1,
                                     tenant_id=tenant_id(tenant.namespace, tenant.name, tenant.uid),
                                     uid=tenant.uid, max_running_jobs=max_running_jobs)
            stored = await self._create(key, record)
        failpoint("tenant-after-record", str(key))
        if stored.mod_revision == 0 and (fresh := await self._store.read(key)) is not None:
            self._records[key] = stored = fresh
        await self._ctx.event(body, "Normal", "Placed",
                              f"placed in {tenant.isolation.value} cell {stored.record.cell} "
                              f"at epoch {stored.record.epoch}")
        self._load_changed(stored.record.cell)
        return stored

    async def _create(self, key: TenantKey, record: PlacementRecord) -> Stored:
        if await self._store.create(key, record, guard=self._leadership.guard()):
            # Counted at once for the next decision; its revision is read after the
            # lock, so one placement holds the lock for one etcd round trip only.
            found: Stored | None = Stored(record, 0)
        else:
            found = await self._store.read(key)
        if found is None:
            raise NotLeaderError(f"placement of {key} was refused: the election moved on")
        self._records[key] = found
        return found

    async def update_provisioned(self, key: TenantKey, stored: Stored, max_running_jobs: int,
                                 digest: str) -> None:
        """The record made to say what the cell now holds: the quota and the key's digest."""
        record = stored.record
        updated = replace(record, max_running_jobs=max_running_jobs, key_digest=digest)
        if await self._store.replace(key, updated, mod_revision=stored.mod_revision,
                                     guard=self._leadership.guard()):
            fresh = await self._store.read(key)
            if fresh is not None:
                self._records[key] = fresh
            self._load_changed(record.cell)

    async def replace_record(self, key: TenantKey, stored: Stored, record: PlacementRecord) -> Stored:
        """Compare-and-swap of the record at the revision ``stored`` was read at.

        A record changed meanwhile (a quota update moved ``maxRunningJobs``) is read
        again and the change re-applied once if it still concerns the same cell
        and epoch; anything else is a conflict for the caller to look at.
        """
        for _ in range(2):
            if await self._store.replace(key, record, mod_revision=stored.mod_revision,
                                         guard=self._leadership.guard()):
                fresh = await self.refresh(key)
                if fresh is None:
                    raise CellplaneError(f"the placement record of {key} vanished after a write")
                for cell in {stored.record.cell, record.cell}:
                    self._load_changed(cell)
                return fresh
            current = await self.refresh(key)
            if current is None or (current.record.cell, current.record.epoch) != (
                    stored.record.cell, stored.record.epoch):
                break
            record = replace(record, max_running_jobs=current.record.max_running_jobs,
                             key_digest=current.record.key_digest)
            stored = current
        raise CellplaneError(f"the placement record of {key} changed under the move; "
                             "looking again")

    async def delete(self, key: TenantKey, record: PlacementRecord, *,
                     publish_load: bool = True) -> None:
        """The record removed; ``publish_load``: its cell's status is told at once. (Not for
        the record of an earlier Tenant object of the same name, removed as the new object
        is placed: the cell's next reconcile publishes its load.)"""
        await self._store.delete(key, record, guard=self._leadership.guard())
        self._records.pop(key, None)
        if publish_load:
            self._load_changed(record.cell)

    def _load_changed(self, cell: str) -> None:
        for listener in self.load_changed:
            listener(cell)

    # -- candidates ------------------------------------------------------------------

    def candidates(self) -> list[CellCandidate]:
        """Every cell placement may choose, with what is placed in it."""
        loads = self._loads()
        candidates: list[CellCandidate] = []
        for name, found in self._ctx.cache.cells.items():
            cell = self._cell_settings(found)
            if cell is None or not is_dns_label(name):
                # A dotted name (allowed before the CRD refused it) can never be named in
                # spec.cell or a TenantMove: a tenant placed there could not be moved out.
                continue
            phase = candidate_phase(deleting=found.meta.deleting, reported=found.status.phase)
            tenants, slots = loads.get(name, (0, 0))
            candidates.append(CellCandidate(
                name=CellName(name), region=Region(cell.region), tier=cell.tier,
                ready=phase == "Ready", phase=phase, draining=cell.draining,
                has_standby=bool(cell.standby_regions), tenant_capacity=cell.tenant_capacity,
                worker_slots=cell.worker_slots, tenants_placed=tenants, slots_in_use=slots))
        return candidates

    def _cell_settings(self, found: CellObject) -> CellSettings | None:
        """The cell's spec, parsed once per version of the object (placement reads every
        cell for every tenant)."""
        name, version = found.name, found.meta.resource_version
        known = self._parsed_cells.get(name)
        if known is not None and known[0] == version:
            return known[1]
        try:
            cell = CellSettings.from_body(found.body)
        except (ValueError, ValidationError):
            return None
        self._parsed_cells[name] = (version, cell)
        return cell
