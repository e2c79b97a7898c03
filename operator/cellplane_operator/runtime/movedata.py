"""A TenantMove's data before its cutover: the bulk copy (Copying) and the rounds of
changes after it (CatchingUp), each a few short steps of the move's reconciles.

The bulk copy goes table by table, page by page, for a slice of time per
reconcile; the run keeps its cursor, so the next reconcile carries on where it
stopped (a new leader, which has no run, copies again from the start: always
safe, as every apply is an upsert of the source's current version). Catching up
is one round of changes per reconcile, until the last changes fit the write-pause
budget (the cutover, ``runtime/movecutover.py``) or never will (the move fails).

A cell of the move that changed its primary during the copy (a takeover) starts
the copy again: the source's change capture lives in its database, and a standby
promoted after a region loss may lack the last captured changes; a target that
failed over may lack rows already sent. Either way the copy may have a gap no
verification should have to find; a fresh copy has none.
"""

from __future__ import annotations

import logging

from cellplane_operator.domain.move_copy import (
    CatchUpRound, CutOver, NeverFits, OverBudget, after_catch_up_round, changed_primary,
    checksum_seconds, copy_rate,
)
from cellplane_operator.domain.move_status import MoveReport
from cellplane_operator.domain.move_steps import (
    Again, StepOutcome, checksums_due, fixed_pause_seconds, slice_over,
)
from cellplane_operator.domain.moves import MovePhase, RecordView, target_epoch
from cellplane_operator.errors import CellplaneError
from cellplane_operator.failpoints import failpoint
from cellplane_operator.placement.records import Stored
from cellplane_operator.runtime.movecontext import Move, MoveRun, MoveSupport
from cellplane_operator.runtime.movecopy import TABLES, TenantCopy

__all__ = ["MoveData", "ReadyToCutOver", "record_view"]

log = logging.getLogger(__name__)

_COPY_SLICE_SECONDS = 1.0
"""How long one reconcile pages the bulk copy before it lets other moves have the worker."""
_RETIME_CHECKSUMS_SECONDS = 5.0
"""How often a move whose verification does not fit its budget times the checksums again."""
_DISCARD_TRIES = 60
"""A takeover's old copy is asked to be dropped once a second (one try per reconcile), up
to this many times."""


class ReadyToCutOver:
    """The last catch-up round fits the pause budget: cut over now."""


class MoveData:
    def __init__(self, support: MoveSupport) -> None:
        self._support = support
        self._ctx = support.ctx

    async def open_copy(self, move: Move, stored: Stored, source: str, target: str,
                        run: MoveRun) -> TenantCopy:
        run.copy = TenantCopy(
            self._ctx.cells, tenant_id=stored.record.tenant_id, move_id=move.current.meta.uid,
            source=await self._support.cell_end(source),
            target=await self._support.cell_end(target),
            target_epoch=target_epoch(record_view(stored), source=source), clock=self._ctx.clock)
        return run.copy

    def took_over(self, copy: TenantCopy, run: MoveRun) -> str | None:
        """Why the copy must start again (a cell changed its primary since it began), or
        None."""
        if run.epochs is None:
            return None
        changed = changed_primary((copy.source.cell, copy.target.cell), run.epochs,
                                  self._support.cell_epochs(copy))
        return None if changed is None else changed.message

    async def copy(self, move: Move, copy: TenantCopy, run: MoveRun) -> StepOutcome:
        """One slice of the bulk copy; the copy begins (capture on in the source) when the
        run has none under way."""
        if run.copy_table is None:
            if (why := self.took_over(copy, run)) is not None:
                # A copy interrupted by a restart: whatever the cells did meanwhile, a
                # takeover would have left the target rows the source no longer has.
                return await self.copy_again(move, run, why)
            run.epochs = self._support.cell_epochs(copy)
            run.totals = await copy.start()
            run.copied = {table: 0 for table in TABLES}
            run.copy_table, run.copy_after, run.copy_seconds = 0, None, 0.0
        assert run.copied is not None
        started = self._ctx.clock.monotonic()
        for index in range(run.copy_table or 0, len(TABLES)):
            table = TABLES[index]

            async def on_page(rows: int, table: str = table) -> bool:
                assert run.copied is not None
                run.copied[table] += rows
                await self._support.progress(move, run, copy, MovePhase.COPYING, "Copying",
                                             f"copying the tenant's rows: {table}")
                return not (self._abort_asked(move) or slice_over(
                    started=started, now=self._ctx.clock.monotonic(),
                    slice_seconds=_COPY_SLICE_SECONDS))

            run.copy_after = await copy.copy_table(table, on_page, after=run.copy_after)
            failpoint("move-copying", move.name)
            if run.copy_after is not None:
                run.copy_table = index
                run.copy_seconds += self._ctx.clock.monotonic() - started
                return Again()
        run.copy_seconds += self._ctx.clock.monotonic() - started
        copied = sum(run.copied.values())
        run.rows_per_second = copied / max(run.copy_seconds, 1e-3)
        run.copy_table = None
        await self._support.progress(move, run, copy, MovePhase.CATCHING_UP, "CatchingUp",
                                     f"copied {copied} rows at {run.rows_per_second:.0f} "
                                     "rows/s; copying the changes made since", force=True)
        return Again()

    async def catch_up(self, move: Move, copy: TenantCopy,
                       run: MoveRun) -> StepOutcome | ReadyToCutOver | NeverFits:
        """One round of changes; ready when the next would fit the pause budget.

        Not for ever: a move whose cutover never fits (the fixed part over the budget,
        or changes made faster than they are copied) fails at the progress deadline
        with why, rather than hold its tenant and the capture's cost for good."""
        await self._time_checksums(copy, run)
        if run.epochs is None:
            run.epochs = self._support.cell_epochs(copy)
        if run.catching_up_since is None:
            run.catching_up_since = self._ctx.clock.monotonic()
        if (why := self.took_over(copy, run)) is not None:
            return await self.copy_again(move, run, why)
        spec = move.spec  # read at every round: a budget raised meanwhile counts at once
        round_ = await copy.catch_up()
        run.rows_per_second = copy_rate(run.rows_per_second, rows=round_.rows,
                                        seconds=round_.seconds)
        failpoint("move-catching-up", move.name)
        fixed = fixed_pause_seconds(run.check_seconds)
        budget = spec.max_write_pause_seconds
        after = after_catch_up_round(CatchUpRound(
            pending=round_.pending, rows_per_second=run.rows_per_second,
            fixed_pause_seconds=fixed, max_pause_seconds=budget,
            catching_up_seconds=self._ctx.clock.monotonic() - run.catching_up_since,
            deadline_seconds=self._ctx.settings.move_progress_deadline_seconds),
            source_cell=copy.source.cell)
        if isinstance(after, NeverFits):
            return after
        if isinstance(after, OverBudget):
            await self._say_over_budget(move, run, copy, fixed, budget, round_.pending)
            await self._time_checksums(copy, run)
        else:
            await self._support.progress(move, run, copy, MovePhase.CATCHING_UP, "CatchingUp",
                                         f"{round_.pending} changes left to copy",
                                         delta=round_.pending)
            if isinstance(after, CutOver):
                run.catching_up_since = None
                return ReadyToCutOver()
        return Again(0.2 if round_.rows == 0 else 0.0)

    async def _time_checksums(self, copy: TenantCopy, run: MoveRun) -> None:
        """Times the verification's checksums on live data: inside the pause they are its
        largest fixed part. The fastest timing counts, so that one taken under a passing
        load does not hold a move back for good; timed again at most every few seconds."""
        now = self._ctx.clock.monotonic()
        if not checksums_due(timed_at=run.checks_timed_at, now=now,
                             every_seconds=_RETIME_CHECKSUMS_SECONDS):
            return
        await copy.checksums()
        took = self._ctx.clock.monotonic() - now
        run.check_seconds = checksum_seconds(
            None if run.checks_timed_at is None else run.check_seconds, took)
        run.checks_timed_at = self._ctx.clock.monotonic()

    async def _say_over_budget(self, move: Move, run: MoveRun, copy: TenantCopy,
                               fixed: float, budget: float, pending: int) -> None:
        message = (f"{pending} changes left to copy, but the pause's fixed part ({fixed:.2f}s: "
                   f"freezing, switching, and verifying checksums that take "
                   f"{run.check_seconds:.2f}s) is over half the {budget:g}s write-pause budget; "
                   "the move waits for it to fit (checksums are timed again every "
                   f"{_RETIME_CHECKSUMS_SECONDS:g}s) or for a larger spec.maxWritePauseSeconds")
        await self._support.progress(move, run, copy, MovePhase.CATCHING_UP, "PauseOverBudget",
                                     message, delta=pending)
        if not run.said_over_budget:
            run.said_over_budget = True
            await self._support.event(move, "Warning", "PauseOverBudget", message)

    async def copy_again(self, move: Move, run: MoveRun, why: str) -> StepOutcome:
        """Both ends forget this copy; the move copies from the start once it is dropped."""
        assert run.copy is not None
        run.discarding, run.discard_why, run.discard_tries = run.copy, why, 0
        run.forget_copy()
        run.epochs, run.check_seconds, run.checks_timed_at = None, 0.0, None
        log.warning("move %s: %s; copying again", move.name, why)
        return await self.discard_old_copy(move, run)

    async def discard_old_copy(self, move: Move, run: MoveRun) -> StepOutcome:
        """One try per reconcile to drop the old copy through the cells' current primaries
        (a new primary may take a few seconds to serve). A target copy that cannot be
        dropped within the minute stays, and the verification finds what it holds extra."""
        assert run.discarding is not None
        copy = run.discarding
        try:
            copy = copy.through(await self._support.cell_end(copy.source.cell),
                                await self._support.cell_end(copy.target.cell))
            await copy.discard()
        except CellplaneError as error:
            run.discard_tries += 1
            if run.discard_tries < _DISCARD_TRIES:
                log.info("move %s: the old copy is not discarded yet (%s)", move.name, error)
                return Again(1.0)
        run.discarding = None
        message = f"{run.discard_why}: the copy starts again from the beginning"
        # The epochs the next copy begins under, recorded now: the status keeps the old
        # ones otherwise, and the next copy would see a takeover that is over.
        run.epochs = self._support.cell_epochs(copy)
        try:
            await self._support.report(move, MoveReport(
                MovePhase.COPYING, "CellTookOver", message, copy.source.cell,
                copy.target.cell, {"rowsCopied": 0, "currentDelta": 0}, cell_epochs=run.epochs))
        except CellplaneError:
            # The status still names the old epochs: the next step, reading them, sees
            # the takeover again and starts over from here.
            run.epochs = None
            raise
        await self._support.event(move, "Warning", "CellTookOver", message)
        return Again()

    def _abort_asked(self, move: Move) -> bool:
        """Between pages: an abort asked meanwhile ends the slice so the next step aborts."""
        current = self._ctx.cache.moves.get(move.key)
        return current is None or current.meta.deleting or (
            current.spec is not None and current.spec.abort)


def record_view(stored: Stored) -> RecordView:
    return RecordView(stored.record.cell, stored.record.epoch, stored.record.moving)

