"""Tenant moves: whether a move may start, how its phases follow, and when to cut over.

The rule: copy the tenant to the new cell while the old one serves; at an
instant, the old cell stops for the tenant under the tenant's epoch N; the new
cell starts under N+1; conditional writes refuse whatever the old cell still
sends. Everything here is pure; the controller (``runtime/moves.py``) reads,
asks these functions, acts and reports.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from cellplane_operator.domain.cells import Tier
from cellplane_operator.domain.placement import CellCandidate

__all__ = ["MovePhase", "RefusalReason", "MoveRequest", "Admitted", "Refused", "admit_move",
           "refused_urls",
           "next_phase", "may_abort", "ready_to_cut_over", "fixed_pause_over_budget",
           "TERMINAL_PHASES", "waiting_refusal_phase", "gives_up", "CutoverClock",
           "cutover_reserve", "after_overrun", "Overrun", "MAX_CUTOVER_ATTEMPTS",
           "MOVING_PHASES", "differing_tables", "Resume", "RecordView", "resume",
           "QueuedMove", "moves_ahead", "target_epoch", "KeepSource", "RetireSource",
           "source_retention"]


class MovePhase(StrEnum):
    PENDING = "Pending"
    COPYING = "Copying"
    CATCHING_UP = "CatchingUp"
    CUTTING_OVER = "CuttingOver"
    VERIFYING = "Verifying"
    COMPLETED = "Completed"
    ABORTED = "Aborted"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({MovePhase.COMPLETED, MovePhase.ABORTED, MovePhase.FAILED})
_FORWARD = {
    MovePhase.PENDING: MovePhase.COPYING,
    MovePhase.COPYING: MovePhase.CATCHING_UP,
    MovePhase.CATCHING_UP: MovePhase.CUTTING_OVER,
    MovePhase.CUTTING_OVER: MovePhase.VERIFYING,
    MovePhase.VERIFYING: MovePhase.COMPLETED,
}
_BEFORE_CUTOVER = frozenset({MovePhase.PENDING, MovePhase.COPYING, MovePhase.CATCHING_UP})
MOVING_PHASES = frozenset({MovePhase.COPYING, MovePhase.CATCHING_UP, MovePhase.CUTTING_OVER,
                           MovePhase.VERIFYING})
"""A move in one of these has started and not ended: its tenant is moving."""


class RefusalReason(StrEnum):
    SAME_CELL = "TargetIsSource"
    NO_SUCH_CELL = "TargetNotFound"
    NOT_READY = "TargetNotReady"
    WRONG_TIER = "TargetWrongTier"
    NO_CAPACITY = "TargetFull"
    ALREADY_MOVING = "AlreadyMoving"
    TENANT_DELETING = "TenantDeleting"
    NOT_PLACED = "TenantNotPlaced"
    URL_REFUSED = "TargetRefusesUrls"
    """The target cell's URL policy refuses a target or webhook of the tenant."""

    @property
    def waits(self) -> bool:
        """A refusal the world may lift (the cell gets ready, room is made, the cell or
        the tenant's placement appears): the move stays Pending and is asked again, as
        a Pod waits to be scheduled. The others end it: nothing can make them pass."""
        return self in (RefusalReason.NO_SUCH_CELL, RefusalReason.NOT_READY,
                        RefusalReason.NO_CAPACITY, RefusalReason.NOT_PLACED)


@dataclass(frozen=True)
class MoveRequest:
    tenant: str
    isolation: Tier
    source_cell: str | None
    """Where the tenant is placed now; None if it is not placed yet."""
    max_running_jobs: int
    target: CellCandidate | None
    """The target cell as placement sees it; None when no cell has that name."""
    target_name: str
    tenant_deleting: bool = False
    other_moves: tuple[str, ...] = ()
    """Names of this tenant's other TenantMoves that have not ended."""


@dataclass(frozen=True)
class Admitted:
    target: str


@dataclass(frozen=True)
class Refused:
    reason: RefusalReason
    message: str


def admit_move(request: MoveRequest) -> Admitted | Refused:
    """May this move start? Checked before anything is copied; a refusal starts nothing."""
    tenant, target = request.tenant, request.target
    if request.tenant_deleting:
        return Refused(RefusalReason.TENANT_DELETING,
                       f"tenant {tenant} is being deleted: it is not moved")
    if request.other_moves:
        return Refused(RefusalReason.ALREADY_MOVING,
                       f"tenant {tenant} is already being moved by "
                       f"{', '.join(sorted(request.other_moves))}; one move at a time")
    if request.source_cell is None:
        return Refused(RefusalReason.NOT_PLACED,
                       f"tenant {tenant} is not placed in any cell yet: nothing to move")
    if request.target_name == request.source_cell:
        return Refused(RefusalReason.SAME_CELL,
                       f"tenant {tenant} is in {request.source_cell} already")
    if target is None:
        return Refused(RefusalReason.NO_SUCH_CELL, f"no cell {request.target_name}")
    if target.tier is not request.isolation:
        return Refused(RefusalReason.WRONG_TIER,
                       f"cell {target.name} is {target.tier.value}; tenant {tenant} needs a "
                       f"{request.isolation.value} cell")
    if not target.available:
        return Refused(RefusalReason.NOT_READY,
                       f"cell {target.name} takes no tenants now: {target.describe()}")
    if not target.fits(request.max_running_jobs):
        return Refused(RefusalReason.NO_CAPACITY,
                       f"cell {target.name} has no room for tenant {tenant}: "
                       f"{target.tenants_placed}/{target.tenant_capacity} tenants, "
                       f"{target.free_slots} free worker slots for {request.max_running_jobs}")
    return Admitted(target.name)


def refused_urls(target: str, refusals: Sequence[Mapping[str, str]]) -> Refused | None:
    """The move's refusal when the target cell refuses some of the tenant's URLs (each
    ``{field, url, reason}`` as the cell said, fields as in the Tenant's spec), or None.

    Asked before anything is copied: the cell would refuse those rows mid-copy, and a
    cell with a stricter policy than the source must never receive them."""
    if not refusals:
        return None
    said = "; ".join(f"spec.{r['field']} ({r['url']}): {r['reason']}" for r in refusals)
    return Refused(RefusalReason.URL_REFUSED,
                   f"cell {target} refuses the tenant's {said}; change the Tenant's URLs or "
                   "move it to a cell whose policy allows them")


def next_phase(phase: MovePhase, *, aborted: bool = False, failed: bool = False) -> MovePhase:
    """The phase after ``phase`` finished its work (or an abort, or a failure, came).

    Before the cutover an abort or a failure leaves the tenant on its source
    (the target's partial copy is removed). From the cutover on, the target may
    hold writes the source never saw: nothing rolls back, a failure is retried
    forward and an abort is refused.
    """
    if phase in TERMINAL_PHASES:
        return phase
    if phase in _BEFORE_CUTOVER:
        if aborted:
            return MovePhase.ABORTED
        if failed:
            return MovePhase.FAILED
    return _FORWARD[phase]


def may_abort(phase: MovePhase) -> bool:
    return phase in _BEFORE_CUTOVER


def ready_to_cut_over(*, delta_rows: int, rows_per_second: float, max_pause_seconds: float,
                      fixed_pause_seconds: float) -> bool:
    """Does copying the last delta fit the pause budget?

    The pause is the fixed part (stopping the tenant in the source, moving its
    placement record, starting it in the target) plus the last delta at the
    measured copy rate; half the budget is kept as a reserve for what the
    measurement missed.
    """
    if rows_per_second <= 0:
        return delta_rows == 0 and fixed_pause_seconds <= max_pause_seconds / 2
    return fixed_pause_seconds + delta_rows / rows_per_second <= max_pause_seconds / 2


def fixed_pause_over_budget(*, fixed_pause_seconds: float, max_pause_seconds: float) -> bool:
    """Is the fixed part of the pause alone (the verification's checksums above all, which
    grow with the tenant) more than the half of the budget a cutover may use? Then no
    delta, however small, fits: the move must say so rather than catch up for ever."""
    return fixed_pause_seconds > max_pause_seconds / 2


def waiting_refusal_phase(reason: RefusalReason, *, waited_seconds: float,
                          deadline_seconds: float) -> MovePhase:
    """The phase of a move refused at admission, after it has waited ``waited_seconds``
    since it was created: Pending while the world may still lift the refusal, Failed
    (with that reason) once it has waited its progress deadline, or at once for a
    refusal nothing can lift. A move that cannot start must end, or it holds its tenant
    (one move at a time) for good."""
    if reason.waits and waited_seconds < deadline_seconds:
        return MovePhase.PENDING
    return MovePhase.FAILED


def gives_up(phase: MovePhase, *, failing_seconds: float, deadline_seconds: float) -> bool:
    """Has a move whose every step failed for ``failing_seconds`` (a cell that does not
    serve, a refusal by a cell) run out of its progress deadline? Only before the
    cutover: from there on the source may be frozen, and the move must end it (undo
    or finish), never leave it."""
    return may_abort(phase) and failing_seconds >= deadline_seconds


# -- one move of a tenant at a time ------------------------------------------------

@dataclass(frozen=True)
class QueuedMove:
    """A TenantMove of the tenant, as far as the order of moves cares."""

    name: str
    phase: MovePhase
    created: str
    """Its creationTimestamp as the apiserver wrote it (RFC 3339 in UTC: its text sorts
    in time order); empty if it has none yet."""


def moves_ahead(move: QueuedMove, others: Iterable[QueuedMove]) -> tuple[str, ...]:
    """The names of the tenant's other moves that go before ``move``: every one already
    admitted (past Pending, not ended), and every Pending one created earlier (the
    name breaks a tie). Ended moves hold nothing. So of several moves asked at once,
    the oldest starts and the others wait for it, whichever the leader looks at first."""
    mine = (move.created, move.name)
    return tuple(other.name for other in others
                 if other.name != move.name and other.phase not in TERMINAL_PHASES
                 and (other.phase is not MovePhase.PENDING or (other.created, other.name) < mine))


def target_epoch(record: RecordView, *, source: str) -> int:
    """The tenant's epoch in the target cell: one above the record's while the record
    still names the source (the commit will raise it so); the record's own once the
    commit named the target."""
    return record.epoch + 1 if record.cell == source else record.epoch


# -- the source kept after a dedicated tenant's move -----------------------------

_RETENTION_LOOK_SECONDS = 3600.0
"""A source kept longer than this is looked at again within the hour all the same."""


@dataclass(frozen=True)
class KeepSource:
    """The retention has not passed: look again in ``wait_seconds``."""

    wait_seconds: float


@dataclass(frozen=True)
class RetireSource:
    """The retention has passed: the old dedicated cell may go."""


def source_retention(*, completed_at: datetime.datetime, retain_seconds: int,
                     now: datetime.datetime) -> KeepSource | RetireSource:
    """Whether a completed move's old dedicated cell, which holds only the retained
    read-only copy, is still kept (``retainSourceForSeconds`` since completion)."""
    remaining = (completed_at + datetime.timedelta(seconds=retain_seconds) - now).total_seconds()
    if remaining > 0:
        return KeepSource(min(remaining, _RETENTION_LOOK_SECONDS))
    return RetireSource()


# -- the write pause's bound -----------------------------------------------------

MAX_CUTOVER_ATTEMPTS = 5
"""Cutovers that ran out of their budget (and gave the writes back) before the move fails."""

_RESERVE_FLOOR = 0.25
"""The least share of the budget kept for ending the pause, however lucky the timings."""
_RESERVE_MARGIN = 1.5
"""Ending the pause is timed on calls made a moment before: a machine's load can grow
meanwhile, so the reserve is half as long again as the timing."""


def cutover_reserve(*, record_write_seconds: float, cell_call_seconds: float,
                    max_pause_seconds: float) -> float:
    """The part of the write-pause budget kept for ending the pause, whichever way it ends.

    Past the commit, the pause ends with the target's activation (a cell call) and the
    moving mark cleared (a record write) after the commit's own record write; short of
    it, with the source unfrozen (a cell call) and the mark cleared. Both are timed on
    the cutover itself (the mark's write, the freeze's call), so a slow machine reserves
    more; a margin covers load that grows meanwhile, and a floor timings that came out
    lucky. What the commit's end then takes is the one part of the pause no deadline
    cuts short (a committed move only goes forward): it is measured and reported.
    """
    return max(_RESERVE_MARGIN * (2 * record_write_seconds + cell_call_seconds),
               _RESERVE_FLOOR * max_pause_seconds)


@dataclass(frozen=True)
class CutoverClock:
    """The deadline the cutover carries: every step before the commit must end by
    ``commit_by`` (seconds on one monotonic clock), or the cutover gives the writes back."""

    paused_at: float
    max_pause_seconds: float
    record_write_seconds: float
    cell_call_seconds: float

    @property
    def commit_by(self) -> float:
        return self.paused_at + self.max_pause_seconds - cutover_reserve(
            record_write_seconds=self.record_write_seconds,
            cell_call_seconds=self.cell_call_seconds, max_pause_seconds=self.max_pause_seconds)

    def left(self, now: float) -> float:
        """Seconds the steps before the commit still have (0 or less: none)."""
        return self.commit_by - now


class Overrun(StrEnum):
    RETRY = "Retry"
    """Catch up again, and cut over once more."""
    FAIL = "Fail"
    """The budget never held: the move fails and the tenant stays in its source."""


def after_overrun(attempts: int, *, max_attempts: int = MAX_CUTOVER_ATTEMPTS) -> Overrun:
    """After ``attempts`` cutovers that could not commit within the budget (each one rolled
    back: the source serves again under its epoch), try again or fail."""
    return Overrun.FAIL if attempts >= max_attempts else Overrun.RETRY


# -- verification ---------------------------------------------------------------

def differing_tables(source: Mapping[str, Mapping[str, object]],
                     target: Mapping[str, Mapping[str, object]]) -> tuple[str, ...]:
    """The tables whose row count or checksum differ between the two cells, each
    described for a person ("jobs: 1200 rows in the source, 1199 in the target").

    A table one side does not report at all differs too: a verification that
    compares fewer tables than the source has would let a missing table pass.
    """
    differing: list[str] = []
    for table in sorted(set(source) | set(target)):
        ours, theirs = source.get(table), target.get(table)
        if ours is None or theirs is None:
            differing.append(f"{table}: only the {'target' if ours is None else 'source'} has it")
        elif ours.get("rows") != theirs.get("rows"):
            differing.append(f"{table}: {ours.get('rows')} rows in the source, "
                             f"{theirs.get('rows')} in the target")
        elif ours.get("checksum") != theirs.get("checksum"):
            differing.append(f"{table}: same {ours.get('rows')} rows, different contents")
    return tuple(differing)


# -- resuming after a restart ----------------------------------------------------

class Resume(StrEnum):
    CONTINUE = "Continue"
    """Carry on with the recorded phase: nothing of a cutover is under way."""
    UNDO_CUTOVER = "UndoCutover"
    """A cutover began and was not committed: unfreeze the source, release the
    router's hold and catch up again. Safe because the target never served."""
    ROLL_FORWARD = "RollForward"
    """The placement record already names the target: the move is committed;
    finish it (start the tenant in the target, release the hold)."""
    LOST = "Lost"
    """The tenant's record is gone or names a third cell: nothing to do but fail."""


@dataclass(frozen=True)
class RecordView:
    cell: str
    epoch: int
    moving: bool


def resume(phase: MovePhase, record: RecordView | None, *, source: str, target: str) -> Resume:
    """What a (new) placement leader does with a move it finds half-way.

    The placement record in etcd is the commit point of a move: the compare-and-
    swap that names the target under epoch N+1. Before it, every step is undone
    by unfreezing the source; after it, every step is finished forward. The
    phase in the TenantMove's status only says how far the last leader got; the
    record says what is true.
    """
    if record is None:
        return Resume.LOST
    if record.cell == target:
        # Only the commit's compare-and-swap ever names the target.
        return Resume.ROLL_FORWARD
    if record.cell != source:
        return Resume.LOST
    if record.moving or phase in (MovePhase.CUTTING_OVER, MovePhase.VERIFYING):
        return Resume.UNDO_CUTOVER
    return Resume.CONTINUE
