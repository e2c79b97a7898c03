"""A move's copy measurements and its watch on the cells' primaries, decided purely."""

from __future__ import annotations

import pytest

from cellplane_operator.domain.move_copy import (
    PrimaryChanged, changed_primary, checksum_seconds, copy_rate,
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
