"""Moves, decided purely: which of a tenant's moves goes first, the target's epoch, and
how long a dedicated tenant's old cell is kept."""

from __future__ import annotations

import datetime

from cellplane_operator.domain.moves import (
    KeepSource, MovePhase, QueuedMove, RecordView, RetireSource, moves_ahead, source_retention,
    target_epoch,
)

EARLY, LATE = "2026-12-03T10:00:00Z", "2026-12-03T10:00:05Z"


def test_an_admitted_move_goes_first_whenever_it_was_created() -> None:
    mine = QueuedMove("m1", MovePhase.PENDING, EARLY)
    copying = QueuedMove("m2", MovePhase.COPYING, LATE)
    assert moves_ahead(mine, [copying]) == ("m2",)


def test_of_pending_moves_the_older_goes_first() -> None:
    older = QueuedMove("b", MovePhase.PENDING, EARLY)
    newer = QueuedMove("a", MovePhase.PENDING, LATE)
    assert moves_ahead(newer, [older]) == ("b",)
    assert moves_ahead(older, [newer]) == ()


def test_pending_moves_created_at_once_go_in_name_order() -> None:
    a, b = QueuedMove("a", MovePhase.PENDING, EARLY), QueuedMove("b", MovePhase.PENDING, EARLY)
    assert moves_ahead(b, [a]) == ("a",)
    assert moves_ahead(a, [b]) == ()


def test_ended_moves_and_the_move_itself_hold_nothing() -> None:
    mine = QueuedMove("m", MovePhase.PENDING, LATE)
    ended = [QueuedMove(f"e{phase.value}", phase, EARLY)
             for phase in (MovePhase.COMPLETED, MovePhase.ABORTED, MovePhase.FAILED)]
    assert moves_ahead(mine, [*ended, mine]) == ()


def test_a_move_without_a_creation_time_yet_sorts_first() -> None:
    fresh = QueuedMove("z", MovePhase.PENDING, "")
    assert moves_ahead(QueuedMove("a", MovePhase.PENDING, EARLY), [fresh]) == ("z",)


def test_the_target_runs_one_epoch_above_the_source_until_the_commit() -> None:
    assert target_epoch(RecordView("src", 4, False), source="src") == 5
    assert target_epoch(RecordView("src", 4, True), source="src") == 5


def test_after_the_commit_the_target_runs_under_the_records_epoch() -> None:
    assert target_epoch(RecordView("dst", 5, False), source="src") == 5


DONE = datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.timezone.utc)


def test_the_old_cell_is_kept_for_its_retention() -> None:
    now = DONE + datetime.timedelta(seconds=100)
    assert source_retention(completed_at=DONE, retain_seconds=160, now=now) == KeepSource(60.0)


def test_a_long_retention_is_looked_at_again_within_the_hour() -> None:
    assert source_retention(completed_at=DONE, retain_seconds=86400,
                            now=DONE) == KeepSource(3600.0)


def test_the_old_cell_goes_once_its_retention_has_passed() -> None:
    assert isinstance(source_retention(completed_at=DONE, retain_seconds=60,
                                       now=DONE + datetime.timedelta(seconds=60)), RetireSource)
    assert isinstance(source_retention(completed_at=DONE, retain_seconds=0, now=DONE),
                      RetireSource)
