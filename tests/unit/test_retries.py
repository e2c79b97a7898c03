"""The controllers' retry schedule: doubling delays, and one pending retry per key."""

from __future__ import annotations

from collections.abc import Callable

from cellplane_operator.runtime.retries import FailureLog, RetrySchedule


class Timers:
    """A stand-in for the event loop's call_later: records, fires on demand."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, wake: Callable[[], None]) -> None:
        self.scheduled.append((delay, wake))

    def fire_all(self) -> list[float]:
        fired, self.scheduled = self.scheduled, []
        for _, wake in fired:
            wake()
        return [delay for delay, _ in fired]


def schedule(timers: Timers, woken: list[str]) -> RetrySchedule[str]:
    return RetrySchedule(woken.append, first_seconds=1.0, ceiling_seconds=10.0,
                         call_later=timers.call_later)


def test_failures_from_other_wake_ups_add_no_second_pending_retry() -> None:
    timers, woken = Timers(), []
    retries = schedule(timers, woken)
    for _ in range(5):  # the retry, a resync and cell changes, all failing meanwhile
        retries.later("team-a/acme")
    assert timers.fire_all() == [1.0]
    assert woken == ["team-a/acme"]


def test_the_delay_doubles_to_its_ceiling_and_a_reset_starts_it_again() -> None:
    timers, woken = Timers(), []
    retries = schedule(timers, woken)
    delays = []
    for _ in range(6):
        retries.later("acme")
        delays += timers.fire_all()
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    retries.reset("acme")
    retries.later("acme")
    retries.later("hooli")
    assert timers.fire_all() == [1.0, 1.0]
    assert woken[-2:] == ["acme", "hooli"]


def test_a_reset_while_a_retry_is_pending_keeps_that_one_retry() -> None:
    timers, woken = Timers(), []
    retries = schedule(timers, woken)
    retries.later("acme")
    retries.reset("acme")   # the tenant changed: looked at at once, by its own enqueue
    retries.later("acme")   # and failed again before the pending retry fired
    assert timers.fire_all() == [1.0]
    retries.later("acme")   # the reset counts: the first delay again
    assert timers.fire_all() == [1.0]
    retries.later("acme")
    assert timers.fire_all() == [2.0]


def test_a_pending_retry_is_visible_so_a_resync_leaves_the_key_to_it() -> None:
    timers, woken = Timers(), []
    retries = schedule(timers, woken)
    assert not retries.waiting("team-a/acme")
    retries.later("team-a/acme")
    assert retries.waiting("team-a/acme")
    timers.fire_all()
    assert not retries.waiting("team-a/acme")


def test_each_distinct_failure_is_said_once() -> None:
    failures: FailureLog[str] = FailureLog()
    said = [failures.is_new("acme", problem) for problem in
            ["refused", "refused", "refused", "timed out", "timed out", "refused"]]
    assert said == [True, False, False, True, False, True]
    assert failures.is_new("globex", "refused"), "keys are apart"
    failures.cleared("acme")
    assert failures.is_new("acme", "refused"), "after a success, a failure is news again"
    assert failures.is_new("acme", "lease expired: may act until 18:19:43, now 18:19:44")
    assert not failures.is_new("acme", "lease expired: may act until 18:20:13, now 18:20:15")
