"""Tenant moves: whether a move may start, how its phases follow, and when to cut over.

The rule (the scheduler seed's step 3.2): copy the tenant to the new cell while
the old one serves; at an instant, the old cell stops for the tenant under the
tenant's epoch N; the new cell starts under N+1; conditional writes refuse
whatever the old cell still sends. Everything here is pure; the controller
(issue #7) reads, asks these functions, acts and reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cellplane_operator.domain.cells import Tier
from cellplane_operator.domain.placement import CellCandidate

__all__ = ["MovePhase", "RefusalReason", "MoveRequest", "Admitted", "Refused", "admit_move",
           "next_phase", "may_abort", "ready_to_cut_over", "TERMINAL_PHASES"]


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


class RefusalReason(StrEnum):
    SAME_CELL = "TargetIsSource"
    NO_SUCH_CELL = "TargetNotFound"
    NOT_READY = "TargetNotReady"
    WRONG_TIER = "TargetWrongTier"
    NO_CAPACITY = "TargetFull"
    ALREADY_MOVING = "AlreadyMoving"
    TENANT_DELETING = "TenantDeleting"
    NOT_PLACED = "TenantNotPlaced"


@dataclass(frozen=True)
class MoveRequest:
    tenant: str
    isolation: Tier
    source_cell: str | None
    """Where the tenant is placed now; None if it is not placed yet."""
    max_running: int
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
    if not target.fits(request.max_running):
        return Refused(RefusalReason.NO_CAPACITY,
                       f"cell {target.name} has no room for tenant {tenant}: "
                       f"{target.tenants_placed}/{target.tenant_capacity} tenants, "
                       f"{target.free_slots} free worker slots for {request.max_running}")
    return Admitted(target.name)


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
