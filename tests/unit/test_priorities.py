"""Bulkheads between priority classes: which class a worker's free slots go to."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellplane_cells.domain.priorities import (
    Floors, FloorsError, Grant, Priority, next_claim, parse_floors,
)
from cellplane_cells.submission import JobRequest, request_hash

CRITICAL, HIGH, DEFAULT, LOW = Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW
FLOORS = Floors(10, {CRITICAL: 2, HIGH: 2, DEFAULT: 2, LOW: 1})


def fill(floors: Floors, running: Counter[Priority], due: Counter[Priority]) -> list[Grant]:
    """One claim round as the worker runs it: ask, claim what is due, repeat.

    ``due`` is the claimable jobs per class (taken from as they are claimed)."""
    claims: list[Grant] = []
    waiting = {p for p in Priority if due[p] > 0}
    while (grant := next_claim(floors, running, waiting)) is not None:
        got = min(grant.count, due[grant.priority])
        if got == 0:
            waiting.discard(grant.priority)
            continue
        due[grant.priority] -= got
        running[grant.priority] += got
        claims.append(Grant(grant.priority, got))
    return claims


def test_a_low_flood_borrows_every_idle_slot() -> None:
    running: Counter[Priority] = Counter()
    fill(FLOORS, running, Counter({LOW: 1000}))
    assert running == {LOW: 10}


def test_a_critical_arrival_takes_the_first_slot_a_low_flood_frees() -> None:
    running, due = Counter({LOW: 10}), Counter({LOW: 1000, CRITICAL: 3})
    assert fill(FLOORS, running, due) == []  # no slot free: nothing is preempted
    running[LOW] -= 1  # one LOW job ends
    assert fill(FLOORS, running, due) == [Grant(CRITICAL, 1)]
    running[LOW] -= 2
    assert [g.priority for g in fill(FLOORS, running, due)] == [CRITICAL, CRITICAL]
    assert running == {LOW: 7, CRITICAL: 3}


def test_borrowed_slots_go_back_to_the_higher_class_as_they_free_up() -> None:
    running, due = Counter({LOW: 10}), Counter({LOW: 1000, HIGH: 1000})
    for _ in range(9):
        running[LOW] -= 1
        fill(FLOORS, running, due)
    # HIGH took every slot LOW gave back, except LOW's own floor, which stays LOW's.
    assert running == {HIGH: 9, LOW: 1}
    running[LOW] -= 1
    assert fill(FLOORS, running, due) == [Grant(LOW, 1)]


def test_every_class_with_work_gets_its_floor_before_anyone_borrows() -> None:
    running: Counter[Priority] = Counter()
    due = Counter({CRITICAL: 100, HIGH: 100, DEFAULT: 100, LOW: 100})
    claims = fill(FLOORS, running, due)
    assert claims[:4] == [Grant(CRITICAL, 2), Grant(HIGH, 2), Grant(DEFAULT, 2), Grant(LOW, 1)]
    assert claims[4:] == [Grant(CRITICAL, 3)]  # the 3 unreserved slots go to the top class


def test_a_class_short_of_work_passes_its_grant_down() -> None:
    running: Counter[Priority] = Counter()
    fill(FLOORS, running, Counter({CRITICAL: 1, DEFAULT: 100}))
    assert running == {CRITICAL: 1, DEFAULT: 9}


def test_no_floors_means_strict_priority() -> None:
    running: Counter[Priority] = Counter({LOW: 5})
    fill(Floors.none(10), running, Counter({LOW: 100, DEFAULT: 100}))
    assert running == {LOW: 5, DEFAULT: 5}


def test_nothing_is_claimed_without_work_or_without_a_free_slot() -> None:
    assert next_claim(FLOORS, {}, set()) is None
    assert next_claim(FLOORS, {LOW: 10}, set(Priority)) is None


def test_floors_adding_up_to_more_than_the_slots_are_refused() -> None:
    with pytest.raises(FloorsError, match="add up to 11, more than the worker's 10 slots"):
        Floors(10, {CRITICAL: 5, HIGH: 5, LOW: 1})
    with pytest.raises(FloorsError, match="more than the worker's 4 slots"):
        parse_floors("CRITICAL=2,HIGH=2,DEFAULT=2", slots=4)


@pytest.mark.parametrize(("text", "problem"), [
    ("URGENT=1", "unknown priority class 'URGENT'"),
    ("CRITICAL", "a floor is CLASS=<slots>"),
    ("CRITICAL=-1", "a floor is CLASS=<slots>"),
    ("CRITICAL=two", "a floor is CLASS=<slots>"),
    ("CRITICAL=1,critical=2", "CRITICAL is given twice"),
])
def test_bad_floor_settings_are_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(FloorsError, match=problem):
        parse_floors(text, slots=10)


def test_floors_parse_and_default() -> None:
    assert parse_floors(" critical=3, LOW=1 ", slots=10) == Floors(10, {CRITICAL: 3, LOW: 1})
    assert parse_floors("", slots=10) == Floors.none(10)
    assert Floors.default_for(10) == FLOORS
    assert Floors.default_for(1) == Floors(1, {CRITICAL: 0, HIGH: 0, DEFAULT: 0, LOW: 0})


def test_floors_written_as_text_read_back_as_themselves() -> None:
    """What the operator puts on a worker's command line (``--priority-floors``)."""
    assert FLOORS.as_text() == "CRITICAL=2,HIGH=2,DEFAULT=2,LOW=1"
    assert parse_floors(FLOORS.as_text(), slots=10) == FLOORS
    assert parse_floors(Floors(3, {HIGH: 1}).as_text(), slots=3).floor(HIGH) == 1


counts = st.integers(min_value=0, max_value=30)


# No timing checks: a loaded machine slows generation and runs alike, and says nothing
# about the rule.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(1, 20), floor_parts=st.lists(st.integers(0, 5), min_size=4, max_size=4),
       running_parts=st.lists(counts, min_size=4, max_size=4),
       due_parts=st.lists(counts, min_size=4, max_size=4))
def test_a_round_never_overfills_and_never_leaves_a_slot_idle_while_work_waits(
    slots: int, floor_parts: list[int], running_parts: list[int], due_parts: list[int],
) -> None:
    if sum(floor_parts) > slots:
        floor_parts = [0, 0, 0, 0]
    floors = Floors(slots, dict(zip(Priority, floor_parts)))
    running = Counter(dict(zip(Priority, running_parts)))
    while sum(running.values()) > slots:  # a worker never runs more than its slots
        running[max(running, key=lambda p: running[p])] -= 1
    due = Counter(dict(zip(Priority, due_parts)))
    before = Counter(running)
    fill(floors, running, due)
    assert sum(running.values()) == min(slots, sum(before.values()) + sum(due_parts))
    for priority in Priority:
        granted = running[priority] - before[priority]
        # A class is kept under its floor only when it ran out of work or slots ran out.
        if running[priority] < floors.floor(priority):
            assert due[priority] == 0 or sum(running.values()) == slots
        # A lower class is served beyond its floor only when every higher class ran dry.
        if granted and running[priority] > floors.floor(priority):
            higher = list(Priority)[:list(Priority).index(priority)]
            assert all(due[h] == 0 for h in higher)


def test_a_default_job_hashes_as_before_classes_so_a_retry_across_the_upgrade_still_matches(
) -> None:
    fields = dict(target="default", payload={"n": 1}, steps=1, max_attempts=3, estimate=0,
                  expires_in_seconds=None)
    before = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"))
                            .encode()).digest()
    assert request_hash(JobRequest(**fields)) == before  # type: ignore[arg-type]
    assert request_hash(JobRequest(**fields, priority=CRITICAL)) != before  # type: ignore[arg-type]
