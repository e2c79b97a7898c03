"""A target's AIMD concurrency limit and the admission of a call, as pure functions on controlled time."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_cells.domain.aimd import (
    AimdPolicy,
    DeferReason,
    Signal,
    TargetLimit,
    admit,
    breaker_verdict,
    closed_until,
    on_outcome,
    signal_of,
    slots,
)
from cellplane_cells.domain.breaker import Breaker, BreakerPolicy, BreakerState

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
POLICY = AimdPolicy(initial=8.0, floor=2.0, ceiling=16.0, increase=1.0, decrease_factor=0.5,
                    max_hold_seconds=60.0, busy_wait_seconds=1.0)
BREAKER = BreakerPolicy(failure_threshold=3, cool_down_seconds=10.0, max_cool_down_seconds=60.0)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def fresh(limit: float = 8.0, max_concurrency: int = 16) -> TargetLimit:
    return TargetLimit(limit=limit, max_concurrency=max_concurrency)


def outcome(state: TargetLimit, signal: Signal, *, sent: float = 0.0, now: float = 1.0,
            status: int | None = None, retry_after: float | None = None) -> TargetLimit:
    return on_outcome(state, signal, call_started_at=at(sent), now=at(now), policy=POLICY,
                      status_code=status, retry_after_seconds=retry_after)


@pytest.mark.parametrize(("status", "timed_out", "expected"), [
    (200, False, Signal.SUCCESS), (204, False, Signal.SUCCESS),
    (429, False, Signal.OVERLOAD), (503, False, Signal.OVERLOAD), (None, True, Signal.OVERLOAD),
    (500, False, Signal.FAILURE), (502, False, Signal.FAILURE), (404, False, Signal.FAILURE),
    (None, False, Signal.FAILURE), (302, False, Signal.FAILURE),
])
def test_answers_are_read_as_success_overload_or_no_news(status: int | None, timed_out: bool,
                                                         expected: Signal) -> None:
    assert signal_of(status, timed_out=timed_out) is expected


def test_a_round_of_successes_adds_one_slot_not_one_per_success() -> None:
    state = fresh(8.0)
    for _ in range(8):
        state = outcome(state, Signal.SUCCESS)
    # 8 successes at a limit near 8 add close to one slot (each adds 1/limit).
    assert 8.9 < state.limit < 9.0
    assert slots(state, POLICY) == 8
    state = outcome(state, Signal.SUCCESS)
    assert slots(state, POLICY) == 9


def test_overload_halves_the_limit_down_to_the_floor() -> None:
    state = fresh(8.0)
    limits = []
    for second in range(1, 5):
        # Each call was sent after the previous cut: each is a new signal.
        state = outcome(state, Signal.OVERLOAD, sent=second - 0.5, now=second)
        limits.append(state.limit)
    assert limits == [4.0, 2.0, 2.0, 2.0]
    assert slots(state, POLICY) == 2


def test_failures_of_calls_sent_before_the_last_cut_do_not_cut_again() -> None:
    state = outcome(fresh(8.0), Signal.OVERLOAD, sent=0.0, now=1.0)
    assert state.limit == 4.0 and state.decreased_at == at(1.0)
    # The other calls of the same round answer later: same overload, already counted.
    for now in (1.1, 1.2, 1.3):
        state = outcome(state, Signal.OVERLOAD, sent=0.5, now=now)
    assert state.limit == 4.0
    # A call sent after the cut that is still refused: the target is still overloaded.
    state = outcome(state, Signal.OVERLOAD, sent=1.5, now=2.0)
    assert state.limit == 2.0


def test_after_a_cut_the_limit_recovers_by_additive_steps() -> None:
    state = outcome(fresh(8.0), Signal.OVERLOAD, sent=0.0, now=1.0)
    state = outcome(state, Signal.OVERLOAD, sent=1.5, now=2.0)
    assert state.limit == POLICY.floor
    seen = [slots(state, POLICY)]
    for _ in range(60):
        state = outcome(state, Signal.SUCCESS, now=3.0)
        seen.append(slots(state, POLICY))
    steps = [b - a for a, b in zip(seen, seen[1:])]
    assert set(steps) <= {0, 1}            # never a jump: one slot at a time
    assert seen[-1] >= 10                  # and it does climb back


def test_the_limit_stops_at_the_policy_ceiling_and_the_targets_own() -> None:
    state = fresh(15.5)
    for _ in range(100):
        state = outcome(state, Signal.SUCCESS)
    assert state.limit == 16.0 and slots(state, POLICY) == 16
    own = fresh(3.0, max_concurrency=4)
    for _ in range(100):
        own = outcome(own, Signal.SUCCESS)
    assert own.limit == 4.0 and slots(own, POLICY) == 4


def test_other_failures_leave_the_limit_alone() -> None:
    state = fresh(8.0)
    assert outcome(state, Signal.FAILURE, status=500) == state


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_on_429_or_503_holds_the_target(status: int) -> None:
    state = outcome(fresh(), Signal.OVERLOAD, status=status, retry_after=30.0, now=1.0)
    assert state.hold_until == at(31.0)


def test_a_hold_only_lengthens_and_is_capped() -> None:
    state = outcome(fresh(), Signal.OVERLOAD, status=429, retry_after=30.0, now=1.0)
    shorter = outcome(state, Signal.OVERLOAD, status=429, retry_after=5.0, sent=2.0, now=2.0)
    assert shorter.hold_until == at(31.0)
    capped = outcome(fresh(), Signal.OVERLOAD, status=429, retry_after=3600.0, now=1.0)
    assert capped.hold_until == at(61.0)
    # Retry-After on a 500 is no throttling signal.
    assert outcome(fresh(), Signal.FAILURE, status=500, retry_after=30.0).hold_until is None


def test_admission_holds_every_job_until_the_retry_after_ends() -> None:
    state = outcome(fresh(), Signal.OVERLOAD, status=429, retry_after=30.0, now=1.0)
    held = admit(state, Breaker(), in_flight=0, now=at(30.9), policy=POLICY, breaker_policy=BREAKER)
    assert (held.admitted, held.defer, held.until) == (False, DeferReason.HELD, at(31.0))
    assert admit(state, Breaker(), in_flight=0, now=at(31.0), policy=POLICY,
                 breaker_policy=BREAKER).admitted


def test_admission_waits_for_an_open_breaker_and_turns_it_half_open_after() -> None:
    opened = Breaker(BreakerState.OPEN, failures=3, open_until=at(10.0))
    waiting = admit(fresh(), opened, in_flight=0, now=at(5.0), policy=POLICY,
                    breaker_policy=BREAKER)
    assert (waiting.defer, waiting.until) == (DeferReason.OPEN, at(10.0))
    probing = admit(fresh(), opened, in_flight=0, now=at(10.0), policy=POLICY,
                    breaker_policy=BREAKER)
    assert probing.admitted and probing.breaker.state is BreakerState.HALF_OPEN
    # The half-open allowance (1) caps the calls below the AIMD limit.
    second = admit(fresh(), probing.breaker, in_flight=1, now=at(10.0), policy=POLICY,
                   breaker_policy=BREAKER)
    assert second.defer is DeferReason.LIMIT


def test_admission_gives_at_most_the_limits_slots() -> None:
    state = fresh(4.7)
    assert admit(state, Breaker(), in_flight=3, now=T0, policy=POLICY,
                 breaker_policy=BREAKER).admitted
    busy = admit(state, Breaker(), in_flight=4, now=T0, policy=POLICY, breaker_policy=BREAKER)
    assert (busy.defer, busy.until) == (DeferReason.LIMIT, at(1.0))


@given(st.lists(st.tuples(st.sampled_from(list(Signal)), st.floats(0, 10)), max_size=200))
def test_the_limit_always_stays_between_floor_and_ceiling(
        events: list[tuple[Signal, float]]) -> None:
    state = fresh(8.0, max_concurrency=12)
    now = 0.0
    for signal, gap in events:
        now += gap
        state = outcome(state, signal, sent=now - gap / 2, now=now, status=429, retry_after=gap)
        assert POLICY.floor <= state.limit <= 12
        assert POLICY.floor <= slots(state, POLICY) <= 12


@pytest.mark.parametrize("kwargs", [
    dict(floor=0.5), dict(initial=300.0), dict(floor=20.0), dict(decrease_factor=1.0),
    dict(decrease_factor=0.0), dict(increase=0.0), dict(max_hold_seconds=-1.0),
    dict(busy_wait_seconds=0.0),
])
def test_policies_that_make_no_sense_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AimdPolicy(**kwargs)


@pytest.mark.parametrize(("status", "retry_after", "verdict"), [
    (200, None, False), (404, None, False),
    (500, None, True), (None, None, True), (429, None, True), (503, None, True),
    # Said when to come back: the hold covers it, the breaker does not count it.
    (429, 5.0, None), (503, 0.0, None),
    (500, 5.0, True),
])
def test_the_breaker_counts_failures_but_not_throttling_with_a_retry_after(
        status: int | None, retry_after: float | None, verdict: bool | None) -> None:
    assert breaker_verdict(status, retry_after_seconds=retry_after) is verdict


def test_a_target_is_closed_until_its_hold_or_its_cool_down_ends_whichever_is_later() -> None:
    assert closed_until(fresh(), Breaker()) is None
    held = outcome(fresh(), Signal.OVERLOAD, status=429, retry_after=30.0, now=1.0)
    assert closed_until(held, Breaker()) == at(31.0)
    opened = Breaker(BreakerState.OPEN, failures=3, open_until=at(40.0))
    assert closed_until(fresh(), opened) == at(40.0)
    assert closed_until(held, opened) == at(40.0)
    half_open = Breaker(BreakerState.HALF_OPEN, failures=3, allowance=1)
    assert closed_until(held, half_open) == at(31.0)
