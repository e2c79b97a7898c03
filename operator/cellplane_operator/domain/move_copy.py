"""What a tenant move's copy measures and watches: its rate, and primaries that changed.

The cutover is planned on measurements (``domain/moves.ready_to_cut_over``):
the copy's rate in rows per second and the time the verification's checksums
take. A copy that runs while a cell of the move changes its primary may have a
gap (``runtime/moves.py`` starts it again). Pure: the controller times the
calls and reads the cells' epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["copy_rate", "RATE_SAMPLE_MIN_ROWS", "checksum_seconds", "PrimaryChanged",
           "changed_primary"]

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
