"""How one reconcile of a TenantMove ends, and the small decisions inside its steps.

The move controller runs each move as a key of the operators' work queue: a
reconcile reads the TenantMove, does one step (admit, a slice of the copy, a
catch-up round, the cutover, an ending) and says what comes next: nothing until
the move changes (``Ended``), or the key again, now or after a wait (``Again``).
A long phase is many reconciles, so one move never holds a worker for long and
no move waits behind another. Pure: the controller reads the clock and the cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Ended", "Again", "StepOutcome", "abort_cause", "slice_over", "report_due",
           "checksums_due", "give_back_wait", "CopyCounts", "copy_counts", "FIXED_PAUSE_FLOOR_SECONDS",
           "fixed_pause_seconds"]


@dataclass(frozen=True)
class Ended:
    """The move has nothing left to do until it changes (or the next resync)."""


@dataclass(frozen=True)
class Again:
    """Reconcile the move again after ``after_seconds`` (0: as soon as a worker is free,
    behind the keys already waiting), or sooner if it changes."""

    after_seconds: float = 0.0


StepOutcome = Ended | Again

FIXED_PAUSE_FLOOR_SECONDS = 0.1
"""etcd writes, the freeze and the activation: what the pause costs besides copying."""


def abort_cause(*, spec_abort: bool, move_deleting: bool, tenant_deleting: bool,
                tenant: str) -> str | None:
    """Why a move before its cutover must stop, as its status says it; None: it goes on.
    ``spec.abort`` first: it is what someone asked for."""
    if spec_abort:
        return "spec.abort"
    if move_deleting:
        return "the TenantMove is being deleted"
    if tenant_deleting:
        return f"tenant {tenant} is being deleted"
    return None


def slice_over(*, started: float, now: float, slice_seconds: float) -> bool:
    """Has a step that works in pages (the bulk copy) held its worker long enough? It then
    returns after the page and the move's next reconcile carries on from the cursor."""
    return now - started >= slice_seconds


def report_due(*, current_phase: str | None, phase: str, force: bool, since_last: float,
               every_seconds: float) -> bool:
    """Is a progress report worth a status write? A new phase always is, as is a forced
    one; within a phase, at most one every ``every_seconds``."""
    return force or current_phase != phase or since_last >= every_seconds


def checksums_due(*, timed_at: float | None, now: float, every_seconds: float) -> bool:
    """Time the verification's checksums again? Not timed in this copy yet, or not for
    ``every_seconds``."""
    return timed_at is None or now - timed_at >= every_seconds


def fixed_pause_seconds(check_seconds: float) -> float:
    """The part of the write pause that does not depend on the last delta."""
    return FIXED_PAUSE_FLOOR_SECONDS + check_seconds


def give_back_wait(overruns: int, *, ceiling_seconds: float = 10.0) -> float:
    """How long a move catches up after a cutover that gave the writes back, before it may
    try again: doubling per overrun, so a loaded machine is not paused again at once."""
    return min(2.0 ** overruns, ceiling_seconds)


@dataclass(frozen=True)
class CopyCounts:
    rows_copied: int
    rows_total: int
    tables: tuple[tuple[str, int, int], ...]
    """(table, copied, total) in the copy's table order, for tables with rows."""


def copy_counts(order: Sequence[str], totals: Mapping[str, int],
                copied: Mapping[str, int]) -> CopyCounts:
    """The bulk copy's progress over all tables and per table, in the order copied."""
    return CopyCounts(
        rows_copied=sum(copied.values()), rows_total=sum(totals.values()),
        tables=tuple((t, copied.get(t, 0), totals.get(t, 0)) for t in order
                     if t in totals or copied.get(t)))
