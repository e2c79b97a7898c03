"""What every step of a TenantMove shares: the move being worked on, what the move
controller remembers of it between reconciles, and the status, Events and cells.

The status is built as the typed ``TenantMoveStatus`` (its conditions planned by
``domain/move_status.py``) and serialised only at the patch. A status write
replaces the move the steps read (``Move.current``) and the cache's copy with the
object the apiserver answers, so the next step sees the phase it just wrote rather
than the watch's older copy.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Literal

from cellplane_operator.api import v1alpha1
from cellplane_operator.domain.cells import SERVING_PHASES
from cellplane_operator.domain.move_status import MoveReport, plan_move_status
from cellplane_operator.domain.move_steps import copy_counts, report_due
from cellplane_operator.domain.moves import MovePhase
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import CELLS, TENANTMOVES
from cellplane_operator.metrics import move_phase_written
from cellplane_operator.placement.records import TenantKey
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.movecopy import TABLES, CellEnd, TenantCopy
from cellplane_operator.runtime.objects import MoveObject
from cellplane_operator.runtime.tenants import TenantController

__all__ = ["Move", "MoveRun", "MoveSupport", "MOVE_FINALIZER"]

log = logging.getLogger(__name__)

MOVE_FINALIZER = "cellplane.io/move"
_PROGRESS_EVERY_SECONDS = 1.0
_DUMP: dict[str, Any] = {"by_alias": True, "exclude_none": True, "mode": "json"}
"""How a status model becomes what the CRD stores."""


class Move:
    """One TenantMove while a reconcile works on it: the view it read, replaced by the
    object each status write returns."""

    def __init__(self, current: MoveObject) -> None:
        self.current = current

    @property
    def key(self) -> TenantKey:
        return self.current.key

    @property
    def name(self) -> str:
        return self.current.meta.name

    @property
    def status(self) -> v1alpha1.TenantMoveStatus:
        return self.current.status

    @property
    def phase(self) -> MovePhase:
        return MovePhase(self.current.status.phase or MovePhase.PENDING.value)

    @property
    def spec(self) -> v1alpha1.TenantMoveSpec:
        """The spec of a move past admission (which refuses one it cannot read)."""
        if self.current.spec is None:
            raise CellplaneError(f"TenantMove {self.key}: {self.current.spec_problem}")
        return self.current.spec

    @property
    def body(self) -> dict[str, Any]:
        """The object as sent, for Events and finalizers."""
        return self.current.body

    def condition(self, type_: str) -> v1alpha1.Condition | None:
        return next((c for c in self.status.conditions or () if c.type == type_), None)


@dataclass
class MoveRun:
    """What the controller remembers of one move between its reconciles while it leads;
    lost with the leadership, and rebuilt from the status and the cells by the next."""

    copy: TenantCopy | None = None
    copy_table: int | None = None
    """The index in TABLES of the table the bulk copy is in; None: no bulk copy under way."""
    copy_after: str | None = None
    """The cursor of the next page of that table; None: its first."""
    copy_seconds: float = 0.0
    """Time spent in the bulk copy's slices so far (its rate's denominator)."""
    rows_per_second: float = 0.0
    check_seconds: float = 0.0
    checks_timed_at: float | None = None
    """The clock's monotonic reading at the last timing of the checksums; None: not timed
    in this copy."""
    said_over_budget: bool = False
    totals: dict[str, int] | None = None
    copied: dict[str, int] | None = None
    last_progress: float = 0.0
    epochs: tuple[int, int] | None = None
    """The source's and the target's placement-group epochs when this copy began."""
    overruns: int = 0
    """Cutovers that could not commit within the budget and gave the writes back."""
    catching_up_since: float | None = None
    """The clock's monotonic reading when this move began catching up (no cutover since)."""
    failing_since: float | None = None
    """The clock's monotonic reading at the first of the steps failing in a row; None: the
    last one passed."""
    discarding: TenantCopy | None = None
    """A copy a takeover made the move give up, not dropped by the cells yet."""
    discard_why: str = ""
    discard_tries: int = 0
    late_freeze: tuple[asyncio.Task[None], TenantCopy, int] | None = None
    """A freeze given up on at its deadline whose answer has not come: the cell may still
    apply it, so the source is unfrozen once more when it answers."""

    def forget_copy(self) -> None:
        """The copy is opened again, and the bulk copy starts from its first table."""
        self.copy, self.copy_table, self.copy_after = None, None, None


class MoveSupport:
    """Status, Events and the cells' admin ends, for every step of a move."""

    def __init__(self, ctx: RegionContext, tenants: TenantController) -> None:
        self.ctx = ctx
        self.tenants = tenants

    # -- reporting -------------------------------------------------------------------

    async def report(self, move: Move, report: MoveReport) -> None:
        current = move.status.model_dump(**_DUMP)
        planned = plan_move_status(report, generation=move.current.meta.generation,
                                   current_conditions=current.get("conditions") or [],
                                   now=self.ctx.clock.now())
        status = v1alpha1.TenantMoveStatus.model_validate(planned)
        wanted = status.model_dump(**_DUMP)
        if all(current.get(k) == v for k, v in wanted.items()):
            return
        updated = await self.ctx.kube.patch(TENANTMOVES, move.name, {"status": wanted},
                                            namespace=move.key.namespace, subresource="status")
        move_phase_written(current.get("phase"), str(wanted["phase"]))
        # The object as the apiserver now has it: the status just written, and a spec
        # changed meanwhile (an abort) too, which the move's own older copy would hide.
        move.current = MoveObject.from_body(updated)
        self.ctx.cache.moves[move.key] = move.current

    async def event(self, move: Move, type_: Literal["Normal", "Warning"], reason: str,
                    message: str) -> None:
        await self.ctx.event(move.body, type_, reason, message)

    def progress_of(self, run: MoveRun | None, delta: int | None = None
                    ) -> v1alpha1.MoveProgress:
        """The bulk copy's counts as this run knows them, and the delta left."""
        if run is None or run.totals is None or run.copied is None:
            return v1alpha1.MoveProgress(current_delta=delta or 0)
        counts = copy_counts(TABLES, run.totals, run.copied)
        return v1alpha1.MoveProgress(
            rows_copied=counts.rows_copied, rows_total=counts.rows_total,
            current_delta=delta or 0,
            tables=tuple(v1alpha1.TableProgress(table=t, copied=c, total=n)
                         for t, c, n in counts.tables))

    async def progress(self, move: Move, run: MoveRun, copy: TenantCopy, phase: MovePhase,
                       reason: str, message: str, *, delta: int | None = None,
                       force: bool = False) -> None:
        """A step's progress in the status, at most every second within a phase; an Event
        when the phase changes."""
        now = self.ctx.clock.monotonic()
        current_phase = move.status.phase
        if not report_due(current_phase=current_phase, phase=phase.value, force=force,
                          since_last=now - run.last_progress,
                          every_seconds=_PROGRESS_EVERY_SECONDS):
            return
        run.last_progress = now
        await self.report(move, MoveReport(phase, reason, message, copy.source.cell,
                                           copy.target.cell, dump(self.progress_of(run, delta)),
                                           cell_epochs=run.epochs))
        if current_phase != phase.value:
            await self.event(move, "Normal", phase.value, message)

    # -- the cells -------------------------------------------------------------------

    async def cell_end(self, cell: str) -> CellEnd:
        found = self.ctx.cache.cells.get(cell)
        status = found.status if found is not None else None
        admin = status.endpoints.admin if status is not None and status.endpoints else None
        phase = status.phase if status is not None else None
        if phase not in SERVING_PHASES or not admin:
            raise CellplaneError(f"cell {cell} does not serve now "
                                 f"({phase or 'no status'}); the move waits for it")
        return CellEnd(cell, str(admin), await self.ctx.cell_admin_token(cell))

    async def cell_gone(self, cell: str) -> bool:
        """Is the Cell deleted or being deleted? The watch's copy says no at once; a yes is
        asked of the apiserver, as a new leader's watch may not have delivered it yet."""
        found = self.ctx.cache.cells.get(cell)
        if found is not None and not found.meta.deleting:
            return False
        body = await self.ctx.kube.get(CELLS, cell)
        return body is None or bool(body["metadata"].get("deletionTimestamp"))

    def cell_epochs(self, copy: TenantCopy) -> tuple[int, int]:
        """The source's and the target's placement-group epochs as the cache has them."""
        def epoch(cell: str) -> int:
            found = self.ctx.cache.cells.get(cell)
            return int(found.status.epoch or 0) if found is not None else 0
        return epoch(copy.source.cell), epoch(copy.target.cell)

    def tenant_deleting(self, key: TenantKey) -> bool:
        found = self.ctx.cache.tenants.get(key)
        return found is None or found.meta.deleting


def dump(progress: v1alpha1.MoveProgress | None) -> dict[str, Any] | None:
    """status.progress as the CRD stores it."""
    return None if progress is None else progress.model_dump(**_DUMP)
