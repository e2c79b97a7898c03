"""How a TenantMove ends before its cutover (Aborted, Failed), and what a completed one
of a dedicated tenant still does (its old cell deleted after the retention).

An ending lets go of all the move holds: the target's partial copy, the source's
change capture (and a freeze of this move), a dedicated cell made for it. It ends
even when a cell does not answer, naming what is left; a cell is asked again for a
bounded time (``_RELEASE_SECONDS``), the longest a reconcile holds its worker here.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from cellplane_operator.domain.dedicated import dedicated_to, made_for_move
from cellplane_operator.domain.move_status import MoveReport
from cellplane_operator.domain.move_steps import Again, Ended, StepOutcome
from cellplane_operator.domain.moves import KeepSource, MovePhase, source_retention
from cellplane_operator.errors import CellplaneError
from cellplane_operator.kube import TENANTMOVES
from cellplane_operator.runtime.movecontext import MOVE_FINALIZER, Move, MoveRun, MoveSupport

__all__ = ["MoveEnding"]

_RELEASE_SECONDS = 30.0
"""How long an ending move keeps asking a cell that does not answer to let go of the move
(the target's copy, the source's capture) before it ends anyway, naming what is left."""
_CELL_CALL_SECONDS = 10.0
"""One release call's bound."""


class MoveEnding:
    def __init__(self, support: MoveSupport) -> None:
        self._support = support
        self._ctx = support.ctx

    async def end(self, move: Move, run: MoveRun, tenant_id: str | None, phase: MovePhase,
                  reason: str, message: str, *, refused: bool = False,
                  progress: dict[str, Any] | None = None) -> Ended:
        """Ends a move before its cutover: Aborted or Failed, after letting go of all it
        holds (the target's copy, the source's capture, a dedicated cell made for it)."""
        status = move.status
        source, target = status.source_cell, status.target_cell
        if run.copy is not None:
            tenant_id = run.copy.tenant_id
        left = [] if tenant_id is None or target is None else await self._release(
            move, tenant_id, str(source), target)
        made = await self._delete_cell_made_for(move)
        if made:
            message += f"; the dedicated cell {made} made for the move is deleted"
        if left:
            message += "; not released: " + "; ".join(left)
        stored_progress = status.progress.model_dump(by_alias=True, exclude_none=True,
                                                     mode="json") if status.progress else None
        await self._support.report(move, MoveReport(phase, reason, message, source, target,
                                                    progress or stored_progress,
                                                    refused=refused))
        await self._support.event(move, "Normal" if phase is MovePhase.ABORTED else "Warning",
                                  reason, message)
        if left:
            await self._support.event(move, "Warning", "NotReleased", "; ".join(left))
        if move.current.meta.deleting:
            await self._ctx.drop_finalizer(TENANTMOVES, move.body, MOVE_FINALIZER)
        return Ended()

    async def after_end(self, move: Move) -> StepOutcome:
        """A move that has ended: its finalizer goes with a deletion; a completed one of a
        dedicated tenant deletes the tenant's old cell once its retention has passed."""
        if move.current.meta.deleting:
            await self._ctx.drop_finalizer(TENANTMOVES, move.body, MOVE_FINALIZER)
            return Ended()
        if move.phase is MovePhase.COMPLETED:
            return await self._retire_dedicated_source(move)
        return Ended()

    async def _retire_dedicated_source(self, move: Move) -> StepOutcome:
        """After a dedicated tenant's move: its old cell, which holds only the retained
        copy, is deleted once ``retainSourceForSeconds`` has passed since completion."""
        source = move.status.source_cell or ""
        cell = self._ctx.cache.cells.get(source)
        spec = move.current.spec
        if cell is None or spec is None or dedicated_to(cell.meta.labels) != (move.key.namespace,
                                                                       spec.tenant):
            return Ended()
        completed = move.condition("Completed")
        if completed is None or completed.status != "True":
            return Ended()
        done_at = datetime.datetime.fromisoformat(
            completed.last_transition_time.replace("Z", "+00:00"))
        retain = spec.retain_source_for_seconds
        retention = source_retention(completed_at=done_at, retain_seconds=retain,
                                     now=self._ctx.clock.now())
        if isinstance(retention, KeepSource):
            return Again(retention.wait_seconds)
        if await self._support.tenants.delete_unused_cell(source):
            await self._support.event(move, "Normal", "SourceCellDeleted",
                                      f"deleted the tenant's old dedicated cell {source}: its "
                                      f"retention of {retain}s has passed")
        return Ended()

    async def _release(self, move: Move, tenant_id: str, source: str,
                       target: str) -> list[str]:
        """The target's copy removed, the source's capture (and a freeze of this move)
        undone; a cell that is gone holds nothing. A cell that does not answer is asked
        again for up to ``_RELEASE_SECONDS``; what it still holds then is returned."""
        move_id = move.current.meta.uid
        cells = self._ctx.cells
        sides = {target: ("the target's copy", cells.cancel_move_in),
                 source: ("the source's change capture", cells.cancel_move_out)}
        left: dict[str, str] = {}
        give_up_at = self._ctx.clock.monotonic() + _RELEASE_SECONDS
        for cell, (what, cancel) in sides.items():
            while True:
                try:
                    if await self._support.cell_gone(cell):
                        left.pop(cell, None)
                        break
                    end = await self._support.cell_end(cell)
                    await asyncio.wait_for(cancel(end.admin, end.token, tenant_id, move_id),
                                           _CELL_CALL_SECONDS)
                    left.pop(cell, None)
                    break
                except (CellplaneError, asyncio.TimeoutError) as error:
                    left[cell] = f"{what} in cell {cell} ({error or 'no answer'})"
                    if self._ctx.clock.monotonic() >= give_up_at:
                        break
                    await asyncio.sleep(1.0)
        return list(left.values())

    async def _delete_cell_made_for(self, move: Move) -> str | None:
        """Deletes the tenant's dedicated cell this move made (its name ends in the move's
        uid, see admission) if it holds no tenant; its name, if a deletion was asked."""
        spec = move.current.spec
        owner = (move.key.namespace, spec.tenant if spec is not None else None)
        for name, cell in list(self._ctx.cache.cells.items()):
            if made_for_move(name, move.current.meta.uid) and dedicated_to(cell.meta.labels) == owner \
                    and await self._support.tenants.delete_unused_cell(name):
                return name
        return None
