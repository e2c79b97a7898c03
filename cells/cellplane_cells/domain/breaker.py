"""The circuit breaker of one webhook endpoint: when to stop calling it, and how to start again.

- **closed**: requests go, up to the endpoint's ``max_concurrency`` at once;
  ``failure_threshold`` failures in a row open the breaker.
- **open**: nothing goes until ``open_until``. Deliveries wait and spend no
  attempts, so an outage of any length costs a delivery nothing but time.
- **half_open**: the cool-down is over; a small allowance of requests may be
  in flight (``initial_allowance``). Each success adds ``growth - 1`` to it,
  so a full round of requests that all succeed multiplies it by ``growth``
  (TCP's slow start); once it reaches ``max_concurrency`` the breaker closes.
  Any failure reopens it, and every failed probe in a row doubles the next
  cool-down (up to ``max_cool_down_seconds``), so an endpoint that stays down
  is probed ever less often.

Why ramp rather than close at the first success: a receiver that has just
come back faces the whole backlog of what it missed. Letting
``max_concurrency`` requests through at once is the flood that can knock it
over again; growing by rounds finds out whether it copes before it gets its
full share. Not doubling per success: with requests in flight together,
that compounds within one round (an allowance of 2 whose two requests both
succeed would become 8, not 4).

Answers that arrive while the breaker is open came from requests sent before
it opened; they change nothing (the cool-down runs its course).

Time is a parameter: the relay passes the database's ``now()``, the one clock
every relay of the cell shares, so two relays agree when a cool-down ends.
The state maps one to one onto the ``webhook_endpoints`` columns ``breaker``,
``failures``, ``open_until`` and ``ramp_allowance``, so it survives restarts.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "BreakerState", "BreakerPolicy", "Breaker", "is_failure", "advance", "capacity",
    "on_success", "on_failure", "cool_down_seconds",
]

# Beyond this many doublings every policy has long reached its ceiling; the
# bound keeps 2 ** n a small number whatever the failure counter says.
_MAX_DOUBLINGS = 32


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    failure_threshold: int = 5
    """Failures in a row that open a closed breaker."""
    cool_down_seconds: float = 30.0
    """How long a breaker stays open after it first opens."""
    max_cool_down_seconds: float = 600.0
    """Ceiling of the cool-down, which doubles with each failed probe in a row."""
    initial_allowance: int = 1
    """Requests that may be in flight when the breaker turns half-open."""
    growth: int = 2
    """Factor the half-open allowance grows by per round of successful requests
    (each success adds ``growth - 1``)."""

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {self.failure_threshold}")
        if not 0 < self.cool_down_seconds <= self.max_cool_down_seconds:
            raise ValueError("cool-downs must satisfy 0 < cool_down_seconds <= max_cool_down_seconds,"
                             f" got {self.cool_down_seconds} and {self.max_cool_down_seconds}")
        if self.initial_allowance < 1:
            raise ValueError(f"initial_allowance must be at least 1, got {self.initial_allowance}")
        if self.growth < 2:
            raise ValueError(f"growth must be at least 2 or the ramp never ends, got {self.growth}")


@dataclass(frozen=True)
class Breaker:
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    """Failures in a row, across reopenings; a success sets it back to 0."""
    open_until: datetime.datetime | None = None
    """End of the cool-down; set only while open."""
    allowance: int = 0
    """Requests that may be in flight while half-open; 0 in the other states."""

    def __post_init__(self) -> None:
        if (self.state is BreakerState.OPEN) != (self.open_until is not None):
            raise ValueError("open_until is set exactly when the breaker is open")
        if (self.state is BreakerState.HALF_OPEN) != (self.allowance >= 1):
            raise ValueError("a half-open breaker has an allowance of at least 1, the others none")
        if self.failures < 0:
            raise ValueError(f"failures cannot be negative, got {self.failures}")


def is_failure(status_code: int | None) -> bool:
    """Does this answer (None: no answer at all) say the endpoint cannot take requests now?

    A 4xx other than 408 and 429 is the endpoint refusing one event, promptly:
    it is healthy, and the delivery goes dead on its own account.
    """
    if status_code is None:
        return True
    return status_code >= 500 or status_code in (408, 429)


def cool_down_seconds(failures: int, policy: BreakerPolicy) -> float:
    """The cool-down after ``failures`` failures in a row (the opening one included)."""
    doublings = min(max(failures - policy.failure_threshold, 0), _MAX_DOUBLINGS)
    return min(policy.max_cool_down_seconds, policy.cool_down_seconds * 2.0 ** doublings)


def advance(breaker: Breaker, *, now: datetime.datetime, policy: BreakerPolicy) -> Breaker:
    """The breaker as it stands at ``now``: an open one whose cool-down is over turns half-open."""
    if breaker.state is BreakerState.OPEN and breaker.open_until is not None \
            and now >= breaker.open_until:
        return Breaker(BreakerState.HALF_OPEN, failures=breaker.failures,
                       allowance=policy.initial_allowance)
    return breaker


def capacity(breaker: Breaker, *, now: datetime.datetime, max_concurrency: int,
             policy: BreakerPolicy) -> int:
    """How many requests to the endpoint may be in flight at ``now``, in-flight ones included."""
    current = advance(breaker, now=now, policy=policy)
    if current.state is BreakerState.CLOSED:
        return max_concurrency
    if current.state is BreakerState.OPEN:
        return 0
    return min(current.allowance, max_concurrency)


def on_success(breaker: Breaker, *, now: datetime.datetime, max_concurrency: int,
               policy: BreakerPolicy) -> Breaker:
    current = advance(breaker, now=now, policy=policy)
    if current.state is BreakerState.OPEN:
        return current
    if current.state is BreakerState.CLOSED:
        return current if current.failures == 0 else Breaker()
    grown = current.allowance + policy.growth - 1
    if grown >= max_concurrency:
        return Breaker()
    return Breaker(BreakerState.HALF_OPEN, failures=0, allowance=grown)


def on_failure(breaker: Breaker, *, now: datetime.datetime, policy: BreakerPolicy) -> Breaker:
    current = advance(breaker, now=now, policy=policy)
    if current.state is BreakerState.OPEN:
        return current
    failures = current.failures + 1
    if current.state is BreakerState.CLOSED and failures < policy.failure_threshold:
        return replace(current, failures=failures)
    # The threshold reached while closed, or a probe failed while half-open.
    until = now + datetime.timedelta(seconds=cool_down_seconds(failures, policy))
    return Breaker(BreakerState.OPEN, failures=failures, open_until=until)
