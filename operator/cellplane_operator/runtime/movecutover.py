"""A TenantMove's cutover: the write pause, the commit, and finishing forward.

The commit point is one compare-and-swap of the tenant's placement record in
etcd: from (source, epoch N) to (target, epoch N+1). Everything before it is
undone by unfreezing the source (the target never served); everything after it
is finished forward.

The write pause, in order: the record is marked moving (the router holds the
tenant's requests), the source freezes the tenant under epoch N+1 (its database
refuses every later write of the tenant, a paused worker's too), the last changes
are copied, both cells' checksums are compared, the record is switched (the
commit), the target starts the tenant, the mark is cleared and the router sends
the held requests to the target. The pause carries its deadline
(``CutoverClock``): a step before the commit still running at it gives the writes
back (the source serves again under epoch N), so a loaded machine makes a move
retry, or fail, never pause longer than its budget. One reconcile does the whole
pause: it is bounded by the budget (at most a minute).

Jobs running in the source at the freeze are stopped there (their writes are
refused) and run again in the target from their last saved step with the same
step idempotency keys: waiting for them would make the pause as long as the
slowest step, which no budget bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from cellplane_operator.api import v1alpha1
from cellplane_operator.domain.move_status import MoveReport
from cellplane_operator.domain.move_steps import Again, Ended, StepOutcome, give_back_wait
from cellplane_operator.domain.moves import (
    MAX_CUTOVER_ATTEMPTS, CutoverClock, MovePhase, Overrun, after_overrun, differing_tables,
)
from cellplane_operator.errors import CellApiError, CellplaneError
from cellplane_operator.failpoints import delay, failpoint
from cellplane_operator.metrics import move_paused
from cellplane_operator.placement.records import Stored, TenantKey
from cellplane_operator.runtime.movecontext import Move, MoveRun, MoveSupport, dump
from cellplane_operator.runtime.movecopy import TenantCopy
from cellplane_operator.runtime.movedata import MoveData
from cellplane_operator.runtime.moveending import MoveEnding

__all__ = ["MoveCutover"]

log = logging.getLogger(__name__)

Checksums = tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]


@dataclass
class _Pause:
    """One write pause under way."""

    paused_at: float
    epoch: int
    """The tenant's epoch before the move: the source serves under it again if given back."""
    stored: Stored
    """The placement record as marked moving."""
    clock: CutoverClock
    freeze: asyncio.Task[None] | None = None
    reported: asyncio.Task[None] | None = None
    """The Verifying status write, started beside the checksums: no part of the pause."""
    last_delta: int = 0
    verified_in: float = 0.0

    def step_at_deadline(self) -> str:
        if self.freeze is None or not self.freeze.done():
            return "freezing the source"
        return "verifying" if self.reported is not None else "copying the last changes"


class MoveCutover:
    def __init__(self, support: MoveSupport, data: MoveData, ending: MoveEnding) -> None:
        self._support = support
        self._tenants = support.tenants
        self._data = data
        self._ending = ending

    async def cut_over(self, move: Move, tenant_key: TenantKey, copy: TenantCopy,
                       run: MoveRun) -> StepOutcome:
        """The write pause, bounded by construction: it carries a deadline, and every step
        before the commit must end by it (the freeze's own lock wait is bounded in the
        source database too). A step that cannot gives the writes back."""
        stored = self._tenants.record(tenant_key)
        if stored is None or stored.record.cell != copy.source.cell:
            raise CellplaneError(f"the placement record of {tenant_key} moved away from "
                                 f"{copy.source.cell}")
        if (why := self._data.took_over(copy, run)) is not None:
            return await self._data.copy_again(move, run, why)
        await self._support.progress(move, run, copy, MovePhase.CUTTING_OVER, "CuttingOver",
                                     "holding the tenant's requests, freezing it in the source, "
                                     "copying its last changes", force=True)
        loop = asyncio.get_running_loop()
        paused_at = loop.time()
        marked = await self._tenants.replace_record(tenant_key, stored,
                                                    replace(stored.record, moving=True))
        took = loop.time() - paused_at
        # Until the freeze is timed, the mark's write stands in for a cell call.
        pause = _Pause(paused_at, stored.record.epoch, marked, CutoverClock(
            paused_at, move.spec.max_write_pause_seconds, record_write_seconds=took,
            cell_call_seconds=took))
        try:
            sums = await self._paused_steps(move, copy, run, pause)
        except TimeoutError:
            return await self._give_back(move, tenant_key, copy, run, pause,
                                         pause.step_at_deadline())
        except CellApiError as error:
            if error.status == 503 and "freeze_timeout" in str(error):
                # The source's database itself gave the freeze up at the deadline.
                return await self._give_back(move, tenant_key, copy, run, pause,
                                             "freezing the source")
            # Any other failure gives the writes back at once, not after a retry's backoff.
            await self.undo_cutover(tenant_key, pause.stored, copy, epoch=pause.epoch)
            await _settled(pause.reported)
            raise
        failpoint("move-verifying", move.name)
        if differing := differing_tables(*sums):
            return await self._verification_failed(move, tenant_key, copy, run, pause, differing)
        if loop.time() > pause.clock.commit_by:
            # Done, but too late to commit and still end the pause within its budget.
            return await self._give_back(move, tenant_key, copy, run, pause, "verifying")
        committed = await self._tenants.replace_record(
            tenant_key, pause.stored, replace(pause.stored.record, cell=copy.target.cell,
                                              epoch=pause.epoch + 1))
        failpoint("move-after-commit", move.name)
        return await self.roll_forward(move, tenant_key, committed, copy, run=run, pause=pause)

    async def _paused_steps(self, move: Move, copy: TenantCopy, run: MoveRun,
                            pause: _Pause) -> Checksums:
        """Freeze, the last changes, the checksums: each by the pause's deadline."""
        loop = asyncio.get_running_loop()
        freezing = loop.time()
        pause.freeze = asyncio.create_task(
            copy.freeze_source(max(pause.clock.left(freezing), 0.0)))
        # The freeze is shielded: given up on, its answer is still awaited later, as the
        # source may apply it after its unfreeze (settle_late_freeze).
        await asyncio.wait_for(asyncio.shield(pause.freeze), max(pause.clock.left(freezing), 0.0))
        pause.clock = replace(pause.clock, cell_call_seconds=loop.time() - freezing)
        failpoint("move-after-freeze", move.name)
        async with asyncio.timeout_at(pause.clock.commit_by):
            await asyncio.sleep(delay("move-slow-delta", move.name))
            pause.last_delta = await copy.drain()
            checked = loop.time()
            pause.reported = asyncio.create_task(self._support.progress(
                move, run, copy, MovePhase.VERIFYING, "Verifying",
                f"comparing row counts and checksums of cells {copy.source.cell} and "
                f"{copy.target.cell}", force=True))
            sums = await copy.checksums()
            pause.verified_in = loop.time() - checked
        return sums

    async def _verification_failed(self, move: Move, tenant_key: TenantKey, copy: TenantCopy,
                                   run: MoveRun, pause: _Pause, differing: tuple[str, ...]
                                   ) -> Ended:
        """The copy differs from the source: the source serves again and the move fails,
        its copy released as any ending's is (a cell slow to drop a large copy does not
        keep the move from ending: what it still holds is named)."""
        await self.undo_cutover(tenant_key, pause.stored, copy, epoch=pause.epoch)
        await _settled(pause.reported)
        message = ("verification failed, the tenant stays in cell "
                   f"{copy.source.cell}: {'; '.join(differing)}")
        return await self._ending.end(move, run, copy.tenant_id, MovePhase.FAILED,
                                      "VerificationFailed", message,
                                      progress=dump(self._support.progress_of(run)))

    async def _give_back(self, move: Move, tenant_key: TenantKey, copy: TenantCopy,
                         run: MoveRun, pause: _Pause, step: str) -> StepOutcome:
        """A cutover that cannot commit within its budget: the source serves again under
        epoch N and the hold ends, inside the budget (the deadline kept a reserve for
        this); then the move catches up to try again, or fails after a few tries."""
        await self.undo_cutover(tenant_key, pause.stored, copy, epoch=pause.epoch)
        paused = asyncio.get_running_loop().time() - pause.paused_at
        move_paused(paused)
        if pause.freeze is not None and not pause.freeze.done():
            run.late_freeze = (pause.freeze, copy, pause.epoch)
        await _settled(pause.reported)
        run.overruns += 1
        budget = move.spec.max_write_pause_seconds
        message = (f"cutover {run.overruns} of at most {MAX_CUTOVER_ATTEMPTS} could not commit "
                   f"within the {budget:g}s write-pause budget ({step} was still under way at "
                   f"its deadline, {pause.clock.commit_by - pause.paused_at:.3f}s into the "
                   f"pause); writes were paused {paused:.3f}s and given back: the tenant serves "
                   f"from cell {copy.source.cell} under epoch {pause.epoch}")
        progress = self._support.progress_of(run).model_copy(
            update={"pause_seconds": round(paused, 4)})
        if after_overrun(run.overruns) is Overrun.FAIL:
            # Releasing cancels the capture, which a freeze landing late then finds gone.
            return await self._ending.end(move, run, copy.tenant_id, MovePhase.FAILED,
                                          "PauseBudgetExceeded", message + "; the move fails",
                                          progress=dump(progress))
        await self._support.report(move, MoveReport(
            MovePhase.CATCHING_UP, "CutoverOverBudget", message + "; catching up to try again",
            copy.source.cell, copy.target.cell, dump(progress), cell_epochs=run.epochs))
        await self._support.event(move, "Warning", "CutoverOverBudget", message)
        return Again(give_back_wait(run.overruns))

    async def settle_late_freeze(self, run: MoveRun) -> None:
        """A freeze given up on at the cutover's deadline may land in the source after the
        unfreeze that gave the writes back (its lock wait there is bounded by the same
        deadline): once it has answered, the source is unfrozen again."""
        if run.late_freeze is None:
            return
        freeze, copy, epoch = run.late_freeze
        with contextlib.suppress(Exception):
            await freeze
        await copy.unfreeze_source(epoch)
        run.late_freeze = None

    async def roll_forward(self, move: Move, tenant_key: TenantKey, stored: Stored,
                           copy: TenantCopy, *, run: MoveRun | None = None,
                           pause: _Pause | None = None) -> Ended:
        """After the commit: start the tenant in the target, release the hold, retire the
        source. Without ``run`` (a new leader finishing a committed move) the progress is
        the one the status holds."""
        spec = move.spec
        await copy.activate_target()
        if stored.record.moving:
            stored = await self._tenants.replace_record(tenant_key, stored,
                                                        replace(stored.record, moving=False))
        pause_seconds = None
        if pause is not None:
            pause_seconds = asyncio.get_running_loop().time() - pause.paused_at
            move_paused(pause_seconds)
            await _settled(pause.reported)
        await copy.finish_source(spec.retain_source_for_seconds)
        progress = (self._support.progress_of(run) if run is not None
                    else move.status.progress or v1alpha1.MoveProgress())
        progress = progress.model_copy(update={"current_delta": 0})
        detail = ""
        if pause is not None and pause_seconds is not None:
            progress = progress.model_copy(update={"pause_seconds": round(pause_seconds, 4)})
            detail = (f"; writes paused {pause_seconds:.3f}s (budget "
                      f"{spec.max_write_pause_seconds:g}s, last delta {pause.last_delta} rows, "
                      f"verification {pause.verified_in:.3f}s)")
        message = (f"tenant {spec.tenant} serves from cell {copy.target.cell} under epoch "
                   f"{stored.record.epoch}{detail}; cell {copy.source.cell} keeps its old rows, "
                   f"read-only, for {spec.retain_source_for_seconds}s")
        await self._support.report(move, MoveReport(MovePhase.COMPLETED, "Completed", message,
                                                    copy.source.cell, copy.target.cell,
                                                    dump(progress)))
        await self._support.event(move, "Normal", "Completed", message)
        await self._tenants.refresh(tenant_key)
        return Ended()

    async def undo_cutover(self, tenant_key: TenantKey, stored: Stored, copy: TenantCopy, *,
                           epoch: int | None = None) -> None:
        """Before the commit: the source serves again and the router stops holding."""
        await copy.unfreeze_source(stored.record.epoch if epoch is None else epoch)
        if stored.record.moving:
            await self._tenants.replace_record(tenant_key, stored,
                                               replace(stored.record, moving=False))


async def _settled(task: asyncio.Task[None] | None) -> None:
    """Waits for a status write started beside the pause; its failure is only logged."""
    if task is not None:
        try:
            await task
        except Exception as error:
            log.warning("a move's status write beside the pause failed: %s", error)
