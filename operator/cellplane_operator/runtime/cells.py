"""The placement leader's controller of Cells: accepted or refused, loaded, deleted last.

What the placement leader says of every Cell, beside what its sites say
(``runtime/cellstatus.py``):

- the ``Accepted`` condition: whether the spec can be carried out in this deployment
  with what is placed in it (``domain.cells.judge_cell``), a Warning once per reason;
- its load, ``status.tenants`` and ``status.slotsInUse``, counted from the placement
  records (``runtime/placing.py``) and written in batches;
- its deletion: the finalizer stays while any tenant is placed in it
  (``domain.cells.cell_deletion``), so that no cell is deleted under its tenants.

It runs on its own work queue, keyed by cell name, and only while the tenant
controller leads, after the placement records are read: the deletion guard and the
loads must count every tenant.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from cellplane_operator.aio import running
from cellplane_operator.api.v1alpha1 import CellStatus
from cellplane_operator.domain.cells import CellFacts, cell_deletion, judge_cell, plan_cell_acceptance
from cellplane_operator.domain.placement import load_to_publish
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS
from cellplane_operator.ownership.election import NotLeaderError
from cellplane_operator.runtime.context import FINALIZER, RegionContext
from cellplane_operator.runtime.objects import CellObject
from cellplane_operator.runtime.placing import Placements, is_dns_label
from cellplane_operator.runtime.specs import CellSettings
from cellplane_operator.runtime.workqueue import WorkQueue

__all__ = ["CellController"]

log = logging.getLogger(__name__)

_MAX_BACKOFF_SECONDS = 30.0
_LOAD_BATCH_SECONDS = 0.2
"""Loads changed within this long are written together: 500 tenants applied at once
would otherwise patch their cells 500 times."""


def _wire(status: CellStatus) -> dict[str, Any]:
    """Only the fields this controller set: the ones its sites own are left alone."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


class CellController:
    def __init__(self, ctx: RegionContext, placements: Placements) -> None:
        self._ctx = ctx
        self._placements = placements
        self._queue: WorkQueue[str] = WorkQueue(
            self._reconcile, first_retry_seconds=1.0,
            retry_ceiling_seconds=_MAX_BACKOFF_SECONDS, ignored=(NotLeaderError,))
        self._announced: dict[str, str] = {}
        self._loads_dirty: set[str] = set()
        self._loads_wake = asyncio.Event()
        placements.load_changed.append(self.load_changed)

    # -- scheduling --------------------------------------------------------------------

    def cell_changed(self, name: str, _before: CellObject | None,
                     cell: CellObject | None) -> None:
        if cell is not None:
            self._queue.add(name)

    def load_changed(self, cell: str) -> None:
        """A record placed in ``cell`` came, went or changed its quota."""
        self._loads_dirty.add(cell)
        self._loads_wake.set()

    async def serve(self) -> None:
        """Reconciles every cell, and again on change and at each resync, until cancelled.
        Started by the tenant controller once it leads and has read the records."""
        for name in list(self._ctx.cache.cells):
            self._queue.add(name)
        async with running(self._queue.run(self._ctx.settings.tenant_workers),
                           self._queue.resync_every(self._ctx.settings.resync_seconds,
                                                    lambda: self._ctx.cache.cells),
                           self._publish_loads()) as tasks:
            await asyncio.gather(*tasks)

    # -- one cell ----------------------------------------------------------------------

    async def _reconcile(self, name: str) -> None:
        cell = self._ctx.cache.cells.get(name)
        if cell is None:
            return
        if cell.meta.deleting:
            await self._guard_deletion(cell)
            return
        await self._ctx.ensure_finalizer(CELLS, cell.body, FINALIZER)
        await self.publish_load(name)
        await self._judge(cell)

    async def _guard_deletion(self, cell: CellObject) -> None:
        """The finalizer goes once no tenant is placed in the cell; a Warning once until."""
        holding = [str(key) for key in self._placements.tenants_in(cell.name)]
        blocked = cell_deletion(cell.name, holding)
        if blocked is not None:
            if self._announced.get(cell.name) != blocked.reason:
                self._announced[cell.name] = blocked.reason
                await self._ctx.event(cell.body, "Warning", blocked.reason, blocked.message)
            return
        await self._ctx.drop_finalizer(CELLS, cell.body, FINALIZER)
        self._announced.pop(cell.name, None)

    async def _judge(self, found: CellObject) -> None:
        """The Cell's Accepted condition: what no site of it would say (an unknown region
        runs none) and what the apiserver could not refuse (capacity below what is
        placed, a spec or a name stored under an older CRD). A Warning once per reason."""
        verdict = judge_cell(self._facts(found))
        patch = plan_cell_acceptance(
            verdict, generation=found.meta.generation, current=_wire(found.status),
            now=self._ctx.clock.now())
        if patch is not None:
            await self._ctx.kube.patch(CELLS, found.name,
                                       {"status": _wire(CellStatus.model_validate(patch))},
                                       subresource="status")
        if self._announced.get(found.name) != verdict.reason:
            self._announced[found.name] = verdict.reason
            if not verdict.accepted:
                await self._ctx.event(found.body, "Warning", verdict.reason, verdict.message)

    def _facts(self, found: CellObject) -> CellFacts:
        # Read as the site runners read it: a lease the CRD let through but that cannot
        # run is a spec problem too, which the typed view alone would not see.
        cell: CellSettings | None = None
        problem: str | None = None
        try:
            cell = CellSettings.from_body(found.body)
        except (ValueError, ValidationError) as error:
            problem = str(error)
        load = self._placements.load_of(found.name)
        facts = CellFacts(name=found.name, spec_problem=problem, name_ok=is_dns_label(found.name),
                          tenants_placed=load.tenants, slots_in_use=load.slots_in_use)
        if cell is None:
            return facts
        return replace(facts, region=cell.region, standby_regions=cell.standby_regions,
                       known_regions=tuple(self._ctx.settings.regions), tier=cell.tier,
                       tenant_capacity=cell.tenant_capacity, worker_slots=cell.worker_slots)

    # -- loads -------------------------------------------------------------------------

    async def _publish_loads(self) -> None:
        """Cells' loads, written at most every ``_LOAD_BATCH_SECONDS`` per burst."""
        while True:
            await self._loads_wake.wait()
            await asyncio.sleep(_LOAD_BATCH_SECONDS)
            self._loads_wake.clear()
            cells, self._loads_dirty = self._loads_dirty, set()
            for cell in sorted(cells):
                await self.publish_load(cell)

    async def publish_load(self, name: str) -> None:
        """The cell's tenants and slots in use, from the records, if its status differs.
        Also asked before a cell is deleted: the admission policy refuses the deletion of
        a Cell whose status counts tenants."""
        found = self._ctx.cache.cells.get(name)
        if found is None:
            return
        load = load_to_publish(self._placements.load_of(name), shown_tenants=found.status.tenants,
                               shown_slots=found.status.slots_in_use)
        if load is None:
            return
        status = CellStatus(tenants=load.tenants, slots_in_use=load.slots_in_use)
        try:
            await self._ctx.kube.patch(CELLS, name, {"status": _wire(status)},
                                       subresource="status")
        except CellplaneError as error:
            log.warning("cannot publish the load of cell %s: %s", name, error)
