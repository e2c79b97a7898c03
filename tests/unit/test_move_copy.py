"""A move's copy measurements, its watch on the cells' primaries, and when catching up
ends, decided purely."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cellplane_operator.domain.move_copy import (
    CatchUpMore, CatchUpRound, CutOver, NeverFits, OverBudget, PrimaryChanged,
    after_catch_up_round, changed_primary, checksum_seconds, copy_rate,
)


def test_the_first_measured_round_sets_the_rate() -> None:
    assert copy_rate(0.0, rows=1000, seconds=0.5) == 2000.0


def test_later_rounds_blend_evenly_with_the_rate_known() -> None:
    assert copy_rate(2000.0, rows=1000, seconds=1.0) == 1500.0


def test_a_round_too_small_to_measure_leaves_the_rate() -> None:
    assert copy_rate(2000.0, rows=499, seconds=10.0) == 2000.0
    assert copy_rate(0.0, rows=0, seconds=0.0) == 0.0


def test_a_round_timed_at_zero_seconds_counts_as_a_millisecond() -> None:
    assert copy_rate(0.0, rows=500, seconds=0.0) == pytest.approx(500_000.0)


def test_the_fastest_checksum_timing_counts() -> None:
    assert checksum_seconds(None, 0.8) == 0.8
    assert checksum_seconds(0.3, 0.8) == 0.3
    assert checksum_seconds(0.8, 0.3) == 0.3


def test_unchanged_epochs_are_no_takeover() -> None:
    assert changed_primary(("src", "dst"), (3, 7), (3, 7)) is None


def test_a_changed_epoch_names_the_cell_and_both_epochs() -> None:
    changed = changed_primary(("src", "dst"), (3, 7), (3, 8))
    assert changed == PrimaryChanged("dst", 7, 8) and changed is not None
    assert changed.message == "cell dst changed its primary (epoch 7 -> 8) during the copy"
    assert changed_primary(("src", "dst"), (3, 7), (4, 8)) == PrimaryChanged("src", 3, 4)


ROUND = CatchUpRound(pending=100, rows_per_second=1000.0, fixed_pause_seconds=0.1,
                     max_pause_seconds=2.0, catching_up_seconds=5.0, deadline_seconds=600.0)


def test_a_delta_that_fits_half_the_budget_cuts_over() -> None:
    # 0.1 s fixed + 100 rows at 1000 rows/s = 0.2 s, under half of 2 s.
    assert after_catch_up_round(ROUND, source_cell="src") == CutOver()


def test_a_delta_too_large_for_the_budget_catches_up_more() -> None:
    assert after_catch_up_round(replace(ROUND, pending=5000), source_cell="src") == CatchUpMore()


def test_a_fixed_part_over_half_the_budget_is_over_budget_however_small_the_delta() -> None:
    assert after_catch_up_round(replace(ROUND, pending=0, fixed_pause_seconds=1.5),
                                source_cell="src") == OverBudget()


def test_at_the_deadline_a_delta_that_never_fitted_fails_saying_why() -> None:
    never = after_catch_up_round(replace(ROUND, pending=5000, catching_up_seconds=600.0),
                                 source_cell="src")
    assert never == NeverFits(
        "DeltaNeverFits", "no cutover fitted the 2s write-pause budget within 600s (the "
        "progress deadline): 5000 changes were left to copy at 1000 rows/s; the tenant stays "
        "in cell src")


def test_at_the_deadline_a_fixed_part_over_budget_fails_as_such() -> None:
    never = after_catch_up_round(replace(ROUND, fixed_pause_seconds=1.5,
                                         catching_up_seconds=601.0), source_cell="src")
    assert isinstance(never, NeverFits) and never.reason == "PauseOverBudget"
    assert "the pause's fixed part alone takes 1.50s" in never.message


def test_the_deadline_counts_even_when_the_delta_would_fit_now() -> None:
    # As before: a move past its deadline fails rather than cutting over late.
    assert isinstance(after_catch_up_round(replace(ROUND, catching_up_seconds=600.0),
                                           source_cell="src"), NeverFits)
