"""The webhook endpoint's circuit breaker as a pure state machine, on controlled time."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_cells.domain.breaker import (
    Breaker,
    BreakerPolicy,
    BreakerState,
    advance,
    capacity,
    cool_down_seconds,
    is_failure,
    on_failure,
    on_success,
)

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
POLICY = BreakerPolicy(failure_threshold=3, cool_down_seconds=10.0, max_cool_down_seconds=60.0,
                       initial_allowance=1, growth=2)
MAX = 8


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def fail(breaker: Breaker, times: int, *, now: datetime.datetime = T0) -> Breaker:
    for _ in range(times):
        breaker = on_failure(breaker, now=now, policy=POLICY)
    return breaker


def succeed(breaker: Breaker, *, now: datetime.datetime, max_concurrency: int = MAX) -> Breaker:
    return on_success(breaker, now=now, max_concurrency=max_concurrency, policy=POLICY)


def room(breaker: Breaker, *, now: datetime.datetime, max_concurrency: int = MAX) -> int:
    return capacity(breaker, now=now, max_concurrency=max_concurrency, policy=POLICY)


def test_a_closed_breaker_allows_the_endpoints_whole_cap() -> None:
    assert room(Breaker(), now=T0) == MAX


def test_failures_below_the_threshold_keep_it_closed_and_a_success_forgets_them() -> None:
    breaker = fail(Breaker(), POLICY.failure_threshold - 1)
    assert breaker == Breaker(failures=2)
    assert room(breaker, now=T0) == MAX
    assert succeed(breaker, now=T0) == Breaker()


def test_the_threshold_opens_it_for_the_cool_down_and_nothing_may_go() -> None:
    opened = fail(Breaker(), POLICY.failure_threshold)
    assert opened == Breaker(BreakerState.OPEN, failures=3, open_until=at(10))
    assert room(opened, now=T0) == 0
    assert room(opened, now=at(9.999)) == 0
    assert advance(opened, now=at(9.999), policy=POLICY) is opened


def test_after_the_cool_down_it_is_half_open_with_the_initial_allowance() -> None:
    opened = fail(Breaker(), POLICY.failure_threshold)
    half = advance(opened, now=at(10), policy=POLICY)
    assert half == Breaker(BreakerState.HALF_OPEN, failures=3, allowance=1)
    assert room(opened, now=at(10)) == 1


def ramp(max_concurrency: int) -> tuple[list[int], Breaker]:
    """Rounds of requests after the cool-down, each round as many as allowed, all succeeding."""
    breaker = advance(fail(Breaker(), 3), now=at(10), policy=POLICY)
    rounds = []
    while breaker.state is BreakerState.HALF_OPEN:
        allowed = room(breaker, now=at(11), max_concurrency=max_concurrency)
        rounds.append(allowed)
        for _ in range(allowed):
            breaker = succeed(breaker, now=at(11), max_concurrency=max_concurrency)
    return rounds, breaker


def test_each_round_of_successes_doubles_the_allowance_until_the_cap_closes_it() -> None:
    rounds, breaker = ramp(MAX)
    assert rounds == [1, 2, 4]
    assert breaker == Breaker()
    assert room(breaker, now=at(11)) == MAX


def test_each_success_adds_one_so_concurrent_successes_do_not_compound() -> None:
    breaker = advance(fail(Breaker(), 3), now=at(10), policy=POLICY)
    allowances = []
    while breaker.state is BreakerState.HALF_OPEN:
        allowances.append(breaker.allowance)
        breaker = succeed(breaker, now=at(11))
    assert allowances == [1, 2, 3, 4, 5, 6, 7]


def test_a_cap_that_is_not_a_power_of_the_growth_is_never_exceeded() -> None:
    rounds, breaker = ramp(3)
    assert rounds == [1, 2]
    assert breaker.state is BreakerState.CLOSED


def test_a_faster_growth_triples_per_round() -> None:
    policy = BreakerPolicy(failure_threshold=1, cool_down_seconds=1.0, growth=3)
    breaker = advance(on_failure(Breaker(), now=T0, policy=policy), now=at(1), policy=policy)
    rounds = []
    while breaker.state is BreakerState.HALF_OPEN:
        allowed = capacity(breaker, now=at(1), max_concurrency=20, policy=policy)
        rounds.append(allowed)
        for _ in range(allowed):
            breaker = on_success(breaker, now=at(1), max_concurrency=20, policy=policy)
    assert rounds == [1, 3, 9]


def test_a_cap_of_one_still_needs_one_successful_probe_to_close() -> None:
    half = advance(fail(Breaker(), 3), now=at(10), policy=POLICY)
    assert half.state is BreakerState.HALF_OPEN
    assert room(half, now=at(10), max_concurrency=1) == 1
    assert succeed(half, now=at(10), max_concurrency=1) == Breaker()


def test_a_failed_probe_reopens_it_with_a_doubled_cool_down_up_to_the_ceiling() -> None:
    breaker = fail(Breaker(), 3)
    cool_downs = []
    now = 0.0
    for _ in range(5):
        assert breaker.open_until is not None
        cool_downs.append((breaker.open_until - at(now)).total_seconds())
        now = (breaker.open_until - T0).total_seconds()
        half = advance(breaker, now=at(now), policy=POLICY)
        assert half.state is BreakerState.HALF_OPEN
        breaker = on_failure(half, now=at(now), policy=POLICY)
        assert breaker.state is BreakerState.OPEN
    assert cool_downs == [10, 20, 40, 60, 60]


def test_a_failure_after_some_ramp_successes_reopens_with_the_base_cool_down() -> None:
    half = advance(fail(Breaker(), 3), now=at(10), policy=POLICY)
    ramping = succeed(half, now=at(11))
    assert ramping == Breaker(BreakerState.HALF_OPEN, failures=0, allowance=2)
    reopened = on_failure(ramping, now=at(12), policy=POLICY)
    assert reopened == Breaker(BreakerState.OPEN, failures=1, open_until=at(22))


def test_late_answers_while_open_change_nothing() -> None:
    opened = fail(Breaker(), 3)
    assert on_failure(opened, now=at(1), policy=POLICY) == opened
    assert succeed(opened, now=at(1)) == opened


def test_an_answer_after_the_cool_down_counts_as_a_probe() -> None:
    opened = fail(Breaker(), 3)
    assert succeed(opened, now=at(10)) == Breaker(BreakerState.HALF_OPEN, allowance=2)
    assert on_failure(opened, now=at(10), policy=POLICY).open_until == at(30)


@pytest.mark.parametrize(("status", "failure"), [
    (None, True), (500, True), (503, True), (408, True), (429, True),
    (200, False), (204, False), (400, False), (404, False), (410, False), (301, False),
])
def test_what_counts_as_the_endpoint_failing(status: int | None, failure: bool) -> None:
    assert is_failure(status) is failure


def test_cool_down_never_overflows_on_a_huge_failure_count() -> None:
    assert cool_down_seconds(10**9, POLICY) == POLICY.max_cool_down_seconds


@pytest.mark.parametrize("kwargs", [
    {"failure_threshold": 0}, {"cool_down_seconds": 0}, {"cool_down_seconds": 1000.0},
    {"initial_allowance": 0}, {"growth": 1},
])
def test_policies_that_cannot_work_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerPolicy(**kwargs)  # type: ignore[arg-type]


def test_inconsistent_states_are_refused() -> None:
    with pytest.raises(ValueError):
        Breaker(BreakerState.OPEN)
    with pytest.raises(ValueError):
        Breaker(BreakerState.HALF_OPEN, allowance=0)
    with pytest.raises(ValueError):
        Breaker(BreakerState.CLOSED, allowance=2)


events = st.lists(st.tuples(st.sampled_from(["ok", "fail", "wait"]),
                            st.floats(min_value=0, max_value=30)), max_size=60)


@given(events, st.integers(min_value=1, max_value=16))
def test_no_sequence_of_answers_and_waits_ever_floods_the_endpoint(
    steps: list[tuple[str, float]], max_concurrency: int
) -> None:
    """Capacity never exceeds the cap; while open it is 0; a ramp grows only by successes.

    From the moment the breaker leaves open, the allowance after k successes
    is at most initial + (growth - 1) * k: a recovered endpoint is ramped, not flooded.
    """
    breaker = Breaker()
    clock = 0.0
    successes_since_open: int | None = None
    for kind, seconds in steps:
        if kind == "wait":
            clock += seconds
        now = at(clock)
        allowed = room(breaker, now=now, max_concurrency=max_concurrency)
        current = advance(breaker, now=now, policy=POLICY)
        assert 0 <= allowed <= max_concurrency
        if current.state is BreakerState.OPEN:
            assert allowed == 0
            assert current.open_until is not None and now < current.open_until
            assert (current.open_until - now).total_seconds() <= POLICY.max_cool_down_seconds
        if current.state is BreakerState.HALF_OPEN:
            assert successes_since_open is not None
            assert allowed <= (POLICY.initial_allowance
                               + (POLICY.growth - 1) * successes_since_open)
        if kind == "ok":
            breaker = succeed(breaker, now=now, max_concurrency=max_concurrency)
            if current.state is BreakerState.HALF_OPEN and successes_since_open is not None:
                successes_since_open += 1
        elif kind == "fail":
            breaker = on_failure(breaker, now=now, policy=POLICY)
            if breaker.state is BreakerState.OPEN:
                successes_since_open = 0
        if breaker.state is BreakerState.CLOSED:
            successes_since_open = None
