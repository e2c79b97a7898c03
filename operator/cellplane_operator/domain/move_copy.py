"""A tenant move's copy: its measurements, primaries that changed, when catching up ends.

The cutover is planned on measurements: the copy's rate in rows per second and
the time the verification's checksums take. Each catch-up round then decides
whether the last changes fit the write-pause budget (cut over), not yet (catch
up more), or never will (fail at the progress deadline). A copy that runs while
a cell of the move changes its primary may have a gap (``runtime/moves.py``
starts it again). Pure: the controller times the calls and reads the cells'
epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellplane_operator.domain.moves import (
    MovePhase, fixed_pause_over_budget, gives_up, ready_to_cut_over,
)

__all__ = ["copy_rate", "RATE_SAMPLE_MIN_ROWS", "checksum_seconds", "PrimaryChanged",
           "changed_primary", "CatchUpRound", "CutOver", "CatchUpMore", "OverBudget",
           "NeverFits", "after_catch_up_round"]

RATE_SAMPLE_MIN_ROWS = 500
"""A catch-up round of fewer rows is no measure of the rate: fixed costs dominate it."""


def copy_rate(previous: float, *, rows: int, seconds: float) -> float:
    """The copy's rate after a catch-up round of ``rows`` in ``seconds``: an even blend of
    the rate known so far and this round's (this round's alone if none is known yet);
    unchanged after a round too small to measure."""
    if rows < RATE_SAMPLE_MIN_ROWS:
        return previous
    measured = rows / max(seconds, 1e-3)
    return measured if previous == 0.0 else 0.5 * previous + 0.5 * measured


def checksum_seconds(previous: float | None, took: float) -> float:
    """The checksums' time the cutover plans with: the fastest timing of this copy, so
    that one taken under a passing load does not hold a move back for good."""
    return took if previous is None else min(previous, took)


@dataclass(frozen=True)
class PrimaryChanged:
    cell: str
    before: int
    after: int

    @property
    def message(self) -> str:
        return (f"cell {self.cell} changed its primary (epoch {self.before} -> {self.after}) "
                "during the copy")


def changed_primary(cells: tuple[str, str], before: tuple[int, int],
                    now: tuple[int, int]) -> PrimaryChanged | None:
    """The first of the move's cells (source, target) whose placement-group epoch is not
    the one the copy began under, or None."""
    for cell, was, is_ in zip(cells, before, now):
        if is_ != was:
            return PrimaryChanged(cell, was, is_)
    return None


@dataclass(frozen=True)
class CatchUpRound:
    """Where a move stands after one catch-up round."""

    pending: int
    """Changes left to copy."""
    rows_per_second: float
    fixed_pause_seconds: float
    """The pause's part that does not grow with the changes (freezing, switching, the
    verification's checksums)."""
    max_pause_seconds: float
    catching_up_seconds: float
    """How long the move has caught up without a cutover."""
    deadline_seconds: float
    """The move's progress deadline."""


@dataclass(frozen=True)
class CutOver:
    """The last changes fit the budget: pause the writes now."""


@dataclass(frozen=True)
class CatchUpMore:
    """Not yet: another round."""


@dataclass(frozen=True)
class OverBudget:
    """The fixed part alone is over what a cutover may use: say so, time the checksums
    again, and wait for them to fit (or for a larger budget)."""


@dataclass(frozen=True)
class NeverFits:
    """The progress deadline passed with no cutover that fitted: the move fails."""

    reason: str
    message: str


def after_catch_up_round(state: CatchUpRound, *,
                         source_cell: str) -> CutOver | CatchUpMore | OverBudget | NeverFits:
    """What a move does after a catch-up round. Not for ever: a move whose cutover never
    fits (the fixed part over the budget, or changes made faster than they are copied)
    fails at its progress deadline with why, rather than hold its tenant and the
    capture's cost for good."""
    fixed, budget = state.fixed_pause_seconds, state.max_pause_seconds
    over_budget = fixed_pause_over_budget(fixed_pause_seconds=fixed, max_pause_seconds=budget)
    if gives_up(MovePhase.CATCHING_UP, failing_seconds=state.catching_up_seconds,
                deadline_seconds=state.deadline_seconds):
        return NeverFits(
            "PauseOverBudget" if over_budget else "DeltaNeverFits",
            f"no cutover fitted the {budget:g}s write-pause budget within "
            f"{state.deadline_seconds:g}s (the progress deadline): " + (
                f"the pause's fixed part alone takes {fixed:.2f}s" if over_budget else
                f"{state.pending} changes were left to copy at "
                f"{state.rows_per_second:.0f} rows/s")
            + f"; the tenant stays in cell {source_cell}")
    if over_budget:
        return OverBudget()
    if ready_to_cut_over(delta_rows=state.pending, rows_per_second=state.rows_per_second,
                         max_pause_seconds=budget, fixed_pause_seconds=fixed):
        return CutOver()
    return CatchUpMore()
