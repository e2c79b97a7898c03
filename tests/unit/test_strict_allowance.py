"""The strict allowance (domain/strict_allowance.py): who may have a strict schedule, and
who may queue CRITICAL work."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_cells.domain.priorities import Priority
from cellplane_cells.domain.strict_allowance import (
    AllowanceExceeded, critical_window_problem, is_strict, job_admission, schedule_admission,
)

CRITICAL, DEFAULT = Priority.CRITICAL, Priority.DEFAULT


def admit(*, priority: Priority = DEFAULT, window: int = 0, active: bool = True,
          allowance: int = 2, others: int = 0, holds: bool = False) -> AllowanceExceeded | None:
    return schedule_admission(priority=priority, dispatch_window_seconds=window, active=active,
                              allowance=allowance, others_in_use=others, holds_a_slot=holds)


def test_only_a_zero_window_is_strict() -> None:
    assert is_strict(0) and not is_strict(1) and not is_strict(300)


@pytest.mark.parametrize("priority", [p for p in Priority if p is not CRITICAL])
def test_any_class_but_critical_may_have_a_window(priority: Priority) -> None:
    assert critical_window_problem(priority, 300) is None
    assert critical_window_problem(priority, 0) is None


def test_critical_must_be_strict() -> None:
    assert critical_window_problem(CRITICAL, 0) is None
    problem = critical_window_problem(CRITICAL, 60)
    assert problem is not None and "CRITICAL must be strict" in problem and "60" in problem


def test_a_strict_schedule_takes_a_slot_up_to_the_allowance() -> None:
    assert admit(allowance=2, others=0) is None
    assert admit(allowance=2, others=1) is None
    refused = admit(allowance=2, others=2)
    assert refused is not None and (refused.allowance, refused.in_use) == (2, 2)
    assert "2 active strict schedules" in refused.message


def test_windowed_and_paused_schedules_take_no_slot() -> None:
    assert admit(window=300, allowance=0, others=5) is None
    # An update of a paused schedule: counted when it is resumed.
    assert admit(active=False, allowance=1, others=1) is None


def test_an_update_that_keeps_a_strict_schedule_strict_adds_no_slot() -> None:
    # Even over an allowance that was lowered since: the tenant may edit what it has.
    assert admit(holds=True, allowance=1, others=3) is None
    assert admit(holds=False, allowance=1, others=3) is not None


def test_critical_needs_an_allowance_even_when_nothing_else_is_counted() -> None:
    refused = admit(priority=CRITICAL, allowance=0, others=0)
    assert refused is not None and refused.allowance == 0 and "CRITICAL" in refused.message
    assert admit(priority=CRITICAL, active=False, allowance=0) is not None
    assert admit(priority=CRITICAL, holds=True, allowance=0) is not None
    assert admit(priority=CRITICAL, allowance=1, others=0) is None


def test_an_immediate_job_may_be_critical_only_with_an_allowance() -> None:
    refused = job_admission(priority=CRITICAL, allowance=0, in_use=0)
    assert refused is not None and (refused.allowance, refused.in_use) == (0, 0)
    assert job_admission(priority=CRITICAL, allowance=1, in_use=1) is None
    for priority in Priority:
        if priority is not CRITICAL:
            assert job_admission(priority=priority, allowance=0, in_use=0) is None


@given(allowance=st.integers(0, 50), writes=st.lists(st.booleans(), max_size=80))
def test_admitting_one_at_a_time_never_exceeds_the_allowance(allowance: int,
                                                            writes: list[bool]) -> None:
    """Creates (True) and cancels (False) of strict schedules, each admitted against the
    count so far: the count never passes the allowance, and a create is refused only at it."""
    in_use = 0
    for create in writes:
        if create:
            refused = admit(allowance=allowance, others=in_use)
            assert (refused is not None) == (in_use >= allowance)
            if refused is None:
                in_use += 1
        elif in_use:
            in_use -= 1
        assert in_use <= allowance
