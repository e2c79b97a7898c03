"""How many calls a target may have in flight, and whether a job may call it now.

Each registered target has a concurrency limit that AIMD adjusts from what the
target answers (TCP's congestion avoidance, applied to calls in flight):

- **additive increase**: every success adds ``increase / limit``, so a full
  round of ``limit`` successful calls raises the limit by ``increase`` (one
  slot), whatever the number of calls in flight. Adding a whole slot per
  success would double the limit every round: slow start, not a probe.
- **multiplicative decrease**: a 429, a 503 or a timeout multiplies the limit
  by ``decrease_factor``, never below ``floor``. Calls in flight together
  overload the target together; their failures are one signal, so a failure
  of a call sent before the last decrease changes nothing (the target is
  answering for load that decrease already took away). Without this, the
  ``limit`` calls of one round would cut the limit ``limit`` times over.
- Other failures (a 500, a refused connection) say the target is broken, not
  busy: they are the circuit breaker's business (``domain/breaker.py``), not
  AIMD's, and leave the limit alone.

A ``Retry-After`` on a 429 or a 503 holds the whole target: no job calls it
until then, not only the job that got the answer.

``admit`` puts the three together (hold, breaker, limit) for a job about to
call the target: go, or wait until when and why. A wait is not an attempt.

Time is a parameter: the worker passes the database's ``now()``, the one clock
every worker of the cell shares. The state maps one to one onto the
``target_limits`` columns (migration 0011), so every worker of the cell sees
the same limit, hold and breaker.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, replace
from enum import Enum

from cellplane_cells.domain import breaker as breakers
from cellplane_cells.domain.breaker import Breaker, BreakerPolicy, BreakerState

__all__ = [
    "AimdPolicy", "TargetLimit", "Signal", "DeferReason", "Admission", "signal_of",
    "on_outcome", "slots", "admit", "breaker_verdict", "closed_until",
]

_OVERLOAD_STATUSES = frozenset({429, 503})
_HOLDING_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class AimdPolicy:
    initial: float = 10.0
    """The limit of a target the cell has not called before."""
    floor: float = 1.0
    """The limit never falls below this: a target is always probed by at least one call."""
    ceiling: float = 200.0
    """The limit never rises above this (a target's own ``max_concurrency`` may be lower)."""
    increase: float = 1.0
    """Slots added per round of ``limit`` successful calls."""
    decrease_factor: float = 0.5
    """What an overload answer multiplies the limit by (the seed: load cut in half)."""
    max_hold_seconds: float = 900.0
    """A Retry-After longer than this holds the target only this long."""
    busy_wait_seconds: float = 1.0
    """How long a job that found every slot taken waits before it is claimable again."""

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.initial <= self.ceiling:
            raise ValueError("limits must satisfy 1 <= floor <= initial <= ceiling, got "
                             f"{self.floor}, {self.initial}, {self.ceiling}")
        if not self.increase > 0:
            raise ValueError(f"increase must be positive, got {self.increase}")
        if not 0 < self.decrease_factor < 1:
            raise ValueError(f"decrease_factor must be in (0, 1), got {self.decrease_factor}")
        if not self.max_hold_seconds >= 0:
            raise ValueError(f"max_hold_seconds cannot be negative, got {self.max_hold_seconds}")
        if not self.busy_wait_seconds > 0:
            raise ValueError(f"busy_wait_seconds must be positive, got {self.busy_wait_seconds}")


@dataclass(frozen=True)
class TargetLimit:
    limit: float
    """Calls that may be in flight, as a real number; ``slots`` rounds it down."""
    max_concurrency: int
    """This target's own ceiling (at most the policy's)."""
    decreased_at: datetime.datetime | None = None
    """When the limit was last cut; failures of calls sent before then are not counted again."""
    hold_until: datetime.datetime | None = None
    """No call before this (the latest Retry-After the target gave)."""

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if not self.limit >= 1 or math.isinf(self.limit):
            raise ValueError(f"limit must be a finite number of at least 1, got {self.limit}")


class Signal(str, Enum):
    SUCCESS = "success"
    """A 2xx: the target coped."""
    OVERLOAD = "overload"
    """A 429, a 503 or a timeout: the target is busy; cut the limit."""
    FAILURE = "failure"
    """Anything else: no news about load (a 4xx is the request's fault, a 500 the target's)."""


def signal_of(status_code: int | None, *, timed_out: bool = False) -> Signal:
    """What an answer (None: no answer; ``timed_out``: because the call's timeout ran out)
    says about the target's load."""
    if timed_out or status_code in _OVERLOAD_STATUSES:
        return Signal.OVERLOAD
    if status_code is not None and 200 <= status_code < 300:
        return Signal.SUCCESS
    return Signal.FAILURE


def breaker_verdict(status_code: int | None, *, retry_after_seconds: float | None) -> bool | None:
    """Is this answer a failure for the target's breaker (True), a success (False), or
    neither (None)? A 429 or 503 that says when to come back is neither: the hold keeps
    every job off the target exactly as long as it asked, and counting it as a failure
    would let a throttling but healthy target open its breaker for a whole cool-down."""
    if status_code in _HOLDING_STATUSES and retry_after_seconds is not None \
            and not math.isnan(retry_after_seconds):
        return None
    return breakers.is_failure(status_code)


def slots(state: TargetLimit, policy: AimdPolicy) -> int:
    """Whole calls the limit allows in flight, between the floor and the target's ceiling."""
    ceiling = min(state.max_concurrency, math.floor(policy.ceiling))
    return max(1, min(ceiling, math.floor(max(state.limit, policy.floor))))


def on_outcome(state: TargetLimit, signal: Signal, *, call_started_at: datetime.datetime,
               now: datetime.datetime, policy: AimdPolicy, status_code: int | None = None,
               retry_after_seconds: float | None = None) -> TargetLimit:
    """The target's limit and hold after a call sent at ``call_started_at`` ended at ``now``."""
    held = _held(state, now=now, policy=policy, status_code=status_code,
                 retry_after_seconds=retry_after_seconds)
    ceiling = float(min(state.max_concurrency, policy.ceiling))
    if signal is Signal.SUCCESS:
        grown = min(ceiling, held.limit + policy.increase / held.limit)
        return replace(held, limit=max(grown, policy.floor))
    if signal is Signal.OVERLOAD:
        if held.decreased_at is not None and call_started_at < held.decreased_at:
            return held
        cut = max(policy.floor, min(held.limit, ceiling) * policy.decrease_factor)
        return replace(held, limit=cut, decreased_at=now)
    return held


def _held(state: TargetLimit, *, now: datetime.datetime, policy: AimdPolicy,
          status_code: int | None, retry_after_seconds: float | None) -> TargetLimit:
    """The state with the hold a Retry-After asks for; a hold only ever lengthens."""
    if retry_after_seconds is None or status_code not in _HOLDING_STATUSES \
            or math.isnan(retry_after_seconds):
        return state
    seconds = min(max(retry_after_seconds, 0.0), policy.max_hold_seconds)
    until = now + datetime.timedelta(seconds=seconds)
    if state.hold_until is not None and state.hold_until >= until:
        return state
    return replace(state, hold_until=until)


def closed_until(state: TargetLimit, breaker: Breaker) -> datetime.datetime | None:
    """Until when no job may call the target at all (its hold, or its open breaker's
    cool-down, whichever ends later); None if it may be called now or as soon as a slot
    frees. Every queued job of the target can wait that long without being claimed."""
    ends = [end for end in (state.hold_until,
                            breaker.open_until if breaker.state is BreakerState.OPEN else None)
            if end is not None]
    return max(ends) if ends else None


class DeferReason(str, Enum):
    HELD = "held"
    """The target asked, with Retry-After, not to be called before a time."""
    OPEN = "open"
    """The target's circuit breaker is open."""
    LIMIT = "limit"
    """Every slot the limit (or the half-open breaker's allowance) gives is taken."""


@dataclass(frozen=True)
class Admission:
    """Call now (``defer`` None), or wait until ``until`` for ``defer``'s reason."""
    breaker: Breaker
    """The breaker as it stands at ``now`` (an open one may have turned half-open): save it."""
    defer: DeferReason | None = None
    until: datetime.datetime | None = None

    @property
    def admitted(self) -> bool:
        return self.defer is None


def admit(state: TargetLimit, breaker: Breaker, *, in_flight: int, now: datetime.datetime,
          policy: AimdPolicy, breaker_policy: BreakerPolicy) -> Admission:
    """May one more call go to the target at ``now``, with ``in_flight`` calls already out?"""
    current = breakers.advance(breaker, now=now, policy=breaker_policy)
    if state.hold_until is not None and now < state.hold_until:
        return Admission(current, DeferReason.HELD, state.hold_until)
    if current.state is BreakerState.OPEN:
        return Admission(current, DeferReason.OPEN, current.open_until)
    allowed = min(slots(state, policy),
                  breakers.capacity(current, now=now, max_concurrency=state.max_concurrency,
                                    policy=breaker_policy))
    if in_flight >= allowed:
        return Admission(current, DeferReason.LIMIT,
                         now + datetime.timedelta(seconds=policy.busy_wait_seconds))
    return Admission(current)
