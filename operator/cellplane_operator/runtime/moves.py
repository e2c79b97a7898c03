"""The placement leader's move controller: TenantMoves from admission to completion.

Each TenantMove is a key of the operators' work queue (``runtime/workqueue.py``)
while this operator leads the placement election. A reconcile reads the
TenantMove (and the tenant's placement record, from etcd), does one step and
says what comes next (``domain/move_steps.py``): admission
(``runtime/moveadmission.py``), a slice of the copy or a round of catching up
(``runtime/movedata.py``), the cutover (``runtime/movecutover.py``), an ending
(``runtime/moveending.py``). A long phase is many short reconciles, so no move
holds a worker for long or waits behind another; what a move's steps carry from
one to the next (the open copy, its cursor, its measurements) is kept per move
(``MoveRun``) and rebuilt from the status and the cells by a new leader.

A leader that dies anywhere is replaced by one that reads the placement record
and knows which side of the commit the move is on (``domain/moves.resume``).
A move that cannot proceed ends: an abort is decided before any cell is asked,
and a move stuck before its cutover (a refusal that does not lift, steps that
keep failing, a cutover that never fits) fails at the progress deadline with
its reason, releasing what it holds.
"""

from __future__ import annotations

import asyncio
import logging

from cellplane_operator.aio import first_of, running
from cellplane_operator.domain.move_copy import NeverFits
from cellplane_operator.domain.move_status import MoveReport
from cellplane_operator.domain.move_steps import Again, Ended, StepOutcome, abort_cause
from cellplane_operator.domain.moves import (
    TERMINAL_PHASES, MovePhase, Resume, gives_up, may_abort, resume,
)
from cellplane_operator.metrics import count_moves
from cellplane_operator.ownership.election import Leadership, NotLeaderError
from cellplane_operator.placement.records import Stored, TenantKey
from cellplane_operator.runtime.context import RegionContext
from cellplane_operator.runtime.moveadmission import MoveAdmission
from cellplane_operator.runtime.movecontext import (
    MOVE_FINALIZER, Move, MoveRun, MoveSupport, dump,
)
from cellplane_operator.runtime.movecopy import TenantCopy
from cellplane_operator.runtime.movecutover import MoveCutover
from cellplane_operator.runtime.movedata import MoveData, ReadyToCutOver, record_view
from cellplane_operator.runtime.moveending import MoveEnding
from cellplane_operator.runtime.tenants import TenantController
from cellplane_operator.runtime.workqueue import WorkQueue

__all__ = ["MoveController", "MOVE_FINALIZER"]

log = logging.getLogger(__name__)

_FIRST_RETRY_SECONDS = 0.5
_MAX_BACKOFF_SECONDS = 10.0
_LEADERSHIP_POLL_SECONDS = 1.0
"""Leadership.changed is cleared by the tenant controller; a short poll here costs nothing
and needs no second consumer of that event."""


class MoveController:
    def __init__(self, ctx: RegionContext, leadership: Leadership,
                 tenants: TenantController) -> None:
        self._ctx = ctx
        self._leadership = leadership
        self._tenants = tenants
        self._support = MoveSupport(ctx, tenants)
        self._ending = MoveEnding(self._support)
        self._admission = MoveAdmission(self._support, self._ending)
        self._data = MoveData(self._support)
        self._cutover = MoveCutover(self._support, self._data, self._ending)
        self._queue: WorkQueue[TenantKey] = WorkQueue(
            self._reconcile, first_retry_seconds=_FIRST_RETRY_SECONDS,
            retry_ceiling_seconds=_MAX_BACKOFF_SECONDS, ignored=(NotLeaderError,))
        self._runs: dict[TenantKey, MoveRun] = {}
        self._timers: dict[TenantKey, asyncio.TimerHandle] = {}
        """A move's next reconcile it asked for after a wait (one per move)."""

    # -- scheduling ------------------------------------------------------------------

    def move_changed(self, key: TenantKey) -> None:
        count_moves(m.status.phase for m in self._ctx.cache.moves.values())
        self._queue.changed(key)
        found = self._ctx.cache.moves.get(key)
        if self._leadership.leading and found is not None and found.spec is not None:
            # The Tenant's Moving condition follows the move's phase.
            self._tenants.tenant_changed(TenantKey(key.namespace, found.spec.tenant))

    def tenant_changed(self, key: TenantKey) -> None:
        for move_key, found in list(self._ctx.cache.moves.items()):
            if move_key.namespace == key.namespace and found.spec is not None \
                    and found.spec.tenant == key.name:
                self.move_changed(move_key)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._leadership.leading:
                await self._lead(stop)
            else:
                await first_of(stop, timeout=_LEADERSHIP_POLL_SECONDS)

    async def _lead(self, stop: asyncio.Event) -> None:
        for key in list(self._ctx.cache.moves):
            self._queue.add(key)
        try:
            async with running(self._queue.run(self._ctx.settings.move_workers),
                               self._queue.resync_every(self._ctx.settings.resync_seconds,
                                                        lambda: self._ctx.cache.moves)):
                while not stop.is_set() and self._leadership.leading:
                    await first_of(stop, timeout=_LEADERSHIP_POLL_SECONDS)
        finally:
            # What the steps carried is the next leader's to rebuild from the status.
            self._runs.clear()
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()

    async def _reconcile(self, key: TenantKey) -> None:
        found = self._ctx.cache.moves.get(key)
        if found is None or not self._leadership.leading:
            self._runs.pop(key, None)
            return
        run = self._runs.setdefault(key, MoveRun())
        try:
            outcome = await self._step(Move(found), run)
        except NotLeaderError:
            raise
        except Exception as error:
            run.forget_copy()
            if await self._stuck(key, run, error):
                self._next(key, Ended())
                return
            raise  # retried with the queue's backoff, or at once if the move changes
        run.failing_since = None
        self._next(key, outcome)

    def _next(self, key: TenantKey, outcome: StepOutcome) -> None:
        self._queue.done(key)
        if (timer := self._timers.pop(key, None)) is not None:
            timer.cancel()
        if isinstance(outcome, Ended):
            self._runs.pop(key, None)
        elif outcome.after_seconds <= 0:
            self._queue.add(key)
        else:
            self._timers[key] = asyncio.get_running_loop().call_later(
                outcome.after_seconds, self._queue.add, key)

    # -- the steps -------------------------------------------------------------------

    async def _step(self, move: Move, run: MoveRun) -> StepOutcome:
        phase = move.phase
        if phase in TERMINAL_PHASES:
            return await self._ending.after_end(move)
        if phase is MovePhase.PENDING:
            spec = move.current.spec
            cause = abort_cause(spec_abort=spec is not None and spec.abort,
                                move_deleting=move.current.meta.deleting, tenant_deleting=False,
                                tenant="")
            if cause is not None:
                # Nothing was started but, for a dedicated tenant, the cell made for it.
                return await self._ending.end(move, run, None, MovePhase.ABORTED, "Aborted",
                                              f"aborted before it started ({cause}): "
                                              "nothing was copied")
            return await self._admission.admit(move)
        return await self._under_way(move, run, phase)

    async def _under_way(self, move: Move, run: MoveRun, phase: MovePhase) -> StepOutcome:
        """A move past admission: where the placement record says it is, then its phase."""
        spec, status = move.spec, move.status
        tenant_key = TenantKey(move.key.namespace, spec.tenant)
        source, target = str(status.source_cell), str(status.target_cell)
        # etcd, not memory: a new leader's tenant controller may not have read it yet.
        stored = await self._tenants.refresh(tenant_key, reconcile=False)
        decision = resume(phase, None if stored is None else record_view(stored),
                          source=source, target=target)
        if decision is Resume.LOST:
            return await self._ending.end(
                move, run, None if stored is None else stored.record.tenant_id, MovePhase.FAILED,
                "TenantRecordLost", f"the placement record of tenant {spec.tenant} no longer "
                f"names cell {source}")
        assert stored is not None
        if decision is Resume.CONTINUE and may_abort(phase):
            if (ended := await self._before_the_cells(move, run, stored)) is not None:
                return ended
            if run.discarding is not None:
                return await self._data.discard_old_copy(move, run)
        copy = run.copy or await self._data.open_copy(move, stored, source, target, run)
        if run.epochs is None and status.source_cell_epoch is not None \
                and status.target_cell_epoch is not None:
            # A new leader checks the cells against the epochs the copy began under.
            run.epochs = (status.source_cell_epoch, status.target_cell_epoch)
        if decision is Resume.ROLL_FORWARD:
            return await self._cutover.roll_forward(move, tenant_key, stored, copy)
        if decision is Resume.UNDO_CUTOVER:
            await self._cutover.undo_cutover(tenant_key, stored, copy)
            await self._support.report(move, MoveReport(
                MovePhase.CATCHING_UP, "CutoverRetried",
                "a cutover was interrupted before its commit; the source serves again and "
                "the move catches up once more", source, target, dump(status.progress)))
            return Again()
        if phase is MovePhase.COPYING:
            return await self._data.copy(move, copy, run)
        if phase is MovePhase.CATCHING_UP:
            return await self._catch_up(move, tenant_key, copy, run)
        return Ended()  # resume() continues only the phases before the cutover

    async def _before_the_cells(self, move: Move, run: MoveRun,
                                stored: Stored) -> StepOutcome | None:
        """Before a cell is asked anything: an abort, or a target gone, must end a move even
        when a cell does not answer. (A freeze that lands late finds the move's capture
        cancelled, and is refused.)"""
        spec, source, target = move.spec, move.status.source_cell, str(move.status.target_cell)
        tenant_id = stored.record.tenant_id
        cause = abort_cause(
            spec_abort=spec.abort, move_deleting=move.current.meta.deleting,
            tenant_deleting=self._support.tenant_deleting(TenantKey(move.key.namespace,
                                                                    spec.tenant)),
            tenant=spec.tenant)
        if cause is not None:
            return await self._ending.end(move, run, tenant_id, MovePhase.ABORTED, "Aborted",
                                          f"aborted ({cause}); the tenant stays in cell "
                                          f"{source}, untouched")
        if await self._support.cell_gone(target):
            return await self._ending.end(move, run, tenant_id, MovePhase.FAILED,
                                          "TargetCellGone", f"the target cell {target} is gone "
                                          f"or being deleted; the tenant stays in cell {source}")
        await self._cutover.settle_late_freeze(run)
        return None

    async def _catch_up(self, move: Move, tenant_key: TenantKey, copy: TenantCopy,
                        run: MoveRun) -> StepOutcome:
        after = await self._data.catch_up(move, copy, run)
        if isinstance(after, NeverFits):
            return await self._ending.end(move, run, copy.tenant_id, MovePhase.FAILED,
                                          after.reason, after.message)
        if isinstance(after, ReadyToCutOver):
            return await self._cutover.cut_over(move, tenant_key, copy, run)
        return after

    async def _stuck(self, key: TenantKey, run: MoveRun, error: BaseException) -> bool:
        """A step failed. The move says so (never silently), and gives up at its progress
        deadline if it is still before its cutover. True once the move has ended."""
        try:
            now = self._ctx.clock.monotonic()
            if run.failing_since is None:
                run.failing_since = now
            found = self._ctx.cache.moves.get(key)
            if found is None:
                return False
            move = Move(found)
            phase, status = move.phase, move.status
            if phase is MovePhase.PENDING or phase in TERMINAL_PHASES:
                return False
            deadline = self._ctx.settings.move_progress_deadline_seconds
            failing = now - run.failing_since
            source, target = status.source_cell, status.target_cell
            if not gives_up(phase, failing_seconds=failing, deadline_seconds=deadline):
                await self._support.report(move, MoveReport(
                    phase, "Retrying", f"{error}; retrying (the move fails if no step passes "
                    f"for {deadline:g}s)" if may_abort(phase) else f"{error}; retrying",
                    source, target, dump(status.progress), cell_epochs=run.epochs))
                return False
            stored = self._tenants.record(TenantKey(key.namespace, move.spec.tenant))
            await self._ending.end(move, run, None if stored is None else stored.record.tenant_id,
                                   MovePhase.FAILED, "ProgressDeadlineExceeded",
                                   f"no step passed for {failing:.0f}s (the progress deadline "
                                   f"is {deadline:g}s): {error}; the tenant stays in cell {source}")
            return True
        except Exception:
            log.exception("move %s: could not report its failing step", key)
            return False
