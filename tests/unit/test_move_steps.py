"""The small decisions inside a TenantMove's steps (domain/move_steps.py)."""

from __future__ import annotations

import pytest

from cellplane_operator.domain.move_steps import (
    FIXED_PAUSE_FLOOR_SECONDS, CopyCounts, abort_cause, checksums_due, copy_counts,
    fixed_pause_seconds, give_back_wait, report_due, slice_over,
)


@pytest.mark.parametrize(("abort", "move_deleting", "tenant_deleting", "cause"), [
    (False, False, False, None),
    (True, False, False, "spec.abort"),
    (True, True, True, "spec.abort"),
    (False, True, True, "the TenantMove is being deleted"),
    (False, False, True, "tenant acme is being deleted"),
])
def test_an_abort_names_what_asked_for_it_spec_abort_first(
        abort: bool, move_deleting: bool, tenant_deleting: bool, cause: str | None) -> None:
    assert abort_cause(spec_abort=abort, move_deleting=move_deleting,
                       tenant_deleting=tenant_deleting, tenant="acme") == cause


def test_a_copy_slice_ends_once_it_has_held_its_worker_long_enough() -> None:
    assert not slice_over(started=10.0, now=10.9, slice_seconds=1.0)
    assert slice_over(started=10.0, now=11.0, slice_seconds=1.0)


@pytest.mark.parametrize(("current", "force", "since", "due"), [
    ("Copying", False, 0.5, False),
    ("Copying", False, 1.0, True),
    ("Copying", True, 0.0, True),
    ("Pending", False, 0.0, True),
    (None, False, 0.0, True),
])
def test_progress_is_written_at_a_new_phase_when_forced_or_once_a_second(
        current: str | None, force: bool, since: float, due: bool) -> None:
    assert report_due(current_phase=current, phase="Copying", force=force, since_last=since,
                      every_seconds=1.0) is due


def test_checksums_are_timed_once_per_copy_then_every_few_seconds() -> None:
    assert checksums_due(timed_at=None, now=0.0, every_seconds=5.0)
    assert not checksums_due(timed_at=10.0, now=14.9, every_seconds=5.0)
    assert checksums_due(timed_at=10.0, now=15.0, every_seconds=5.0)


def test_the_pause_fixed_part_is_the_floor_and_the_checksums() -> None:
    assert fixed_pause_seconds(0.0) == FIXED_PAUSE_FLOOR_SECONDS
    assert fixed_pause_seconds(0.4) == pytest.approx(FIXED_PAUSE_FLOOR_SECONDS + 0.4)


def test_a_given_back_cutover_waits_longer_each_time_up_to_a_ceiling() -> None:
    assert [give_back_wait(n) for n in (1, 2, 3, 4, 5)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_copy_counts_sum_the_tables_in_copy_order_leaving_out_empty_ones() -> None:
    counts = copy_counts(("tenant", "targets", "jobs", "steps"),
                         totals={"jobs": 10, "tenant": 1, "steps": 0},
                         copied={"tenant": 1, "jobs": 4, "steps": 0, "targets": 0})
    assert counts == CopyCounts(rows_copied=5, rows_total=11, tables=(
        ("tenant", 1, 1), ("jobs", 4, 10), ("steps", 0, 0)))
