"""When a schedule's runs are due: occurrences, DST, misfires, dispatch windows, run keys.

A schedule is either ``ONCE`` (a local ``run_at`` in an IANA ``time_zone``) or
``CRON`` (a 5-field Unix cron expression read in ``time_zone``). Its occurrences
are wall-clock times in that zone, turned into instants by one rule:

- a wall time in a spring-forward gap (it never happens) runs at the first
  instant after the gap (02:30 on a New York spring night runs at 03:00 EDT);
- a wall time in a fall-back overlap (it happens twice) runs once, at its first
  occurrence (01:30 on a New York autumn night runs at 01:30 EDT, not EST).

The rule holds for every expression, hourly ones included, so "every 15
minutes" in New York is silent during the repeated hour; a schedule that must
tick by elapsed time uses ``UTC``. Cron iteration is cronsim's (the library
healthchecks.io runs its cron checks on), fed naive wall times so that it walks
the calendar and nothing else; the DST rule above is applied here, on each wall
time it yields, instead of cronsim's Debian-cron compromise (which treats
wildcard-hour expressions by elapsed time).

The next occurrence is always computed from the previous scheduled time, never
from the clock, so a late run does not shift the ones after it; lateness is the
misfire policy's business. Time is a parameter: the dispatcher passes the
database's ``now()``.
"""

from __future__ import annotations

import datetime
import enum
import functools
import hashlib
import re
import uuid
import zoneinfo
from collections import deque
from dataclasses import dataclass
from typing import NewType

from cronsim import CronSim, CronSimError

__all__ = [
    "ScheduleId", "ScheduleKind", "MisfirePolicy", "ScheduleError", "Timing", "MisfireRule",
    "DuePlan", "DEFAULT_DISPATCH_WINDOW_SECONDS", "MAX_DISPATCH_WINDOW_SECONDS",
    "DEFAULT_MAX_CATCH_UP_RUNS", "MAX_CATCH_UP_RUNS", "MISFIRE_GRACE",
    "parse_time_zone", "parse_cron", "parse_run_at", "once", "cron", "resolve_wall_time",
    "first_after", "first_occurrence", "dispatch_offset", "idempotency_key", "plan_due",
]

ScheduleId = NewType("ScheduleId", uuid.UUID)

UTC = datetime.timezone.utc

DEFAULT_DISPATCH_WINDOW_SECONDS = 300
"""A new schedule may start anywhere in its first five minutes unless it asks otherwise."""
MAX_DISPATCH_WINDOW_SECONDS = 86_400
"""A window longer than a day would let a daily job's runs overtake each other's meaning."""
DEFAULT_MAX_CATCH_UP_RUNS = 10
"""How many missed occurrences ``RUN_ALL`` replays after an outage, unless told otherwise."""
MAX_CATCH_UP_RUNS = 1_000
"""The ceiling a schedule may ask for: a replay is a burst of jobs at once."""
MISFIRE_GRACE = datetime.timedelta(seconds=60)
"""An occurrence dispatched more than this after its dispatch time was missed, not late."""

# Zone names that mean "this machine's zone", which differs between a cell's sites.
_MACHINE_ZONES = frozenset({"localtime", "posixrules", "Factory"})
# One term of a cron field: `*`, a number or a name, a range, each with an optional step.
# Quartz and Jenkins extensions (L, W, #, ?, H) are not part of the dialect.
_CRON_TERM = re.compile(r"^(\*|([0-9]+|[A-Za-z]{3})(-([0-9]+|[A-Za-z]{3}))?)(/[0-9]+)?$")
_CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
# Searching back from the horizon for the last due occurrences: short spans
# first, so a minutely schedule resumed after a year costs an hour of
# iteration, not a year of it; the last span (None) starts at the floor.
_SEARCH_SPANS = (datetime.timedelta(hours=1), datetime.timedelta(days=1),
                 datetime.timedelta(days=32), datetime.timedelta(days=367),
                 datetime.timedelta(days=8 * 366), None)
_JUST_BEFORE = datetime.timedelta(microseconds=1)
_RUN_AT_YEARS = (1970, 9998)


class ScheduleKind(str, enum.Enum):
    ONCE = "ONCE"
    CRON = "CRON"


class MisfirePolicy(str, enum.Enum):
    RUN_ONCE = "RUN_ONCE"
    """All missed occurrences become one run, keyed by the latest of them."""
    SKIP = "SKIP"
    """Missed occurrences never run; the schedule waits for its next one."""
    RUN_ALL = "RUN_ALL"
    """Each missed occurrence runs, the latest ``max_catch_up_runs`` of them."""


class ScheduleError(ValueError):
    """A schedule that cannot be taken; ``field`` names the request field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Timing:
    """When a schedule fires. Built by ``once`` or ``cron``, which validate."""

    kind: ScheduleKind
    time_zone: str
    cron: str | None = None
    run_at: datetime.datetime | None = None
    """The local wall time of a ``ONCE`` schedule (naive: ``time_zone`` says where)."""

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.time_zone)


@dataclass(frozen=True)
class MisfireRule:
    policy: MisfirePolicy = MisfirePolicy.RUN_ONCE
    max_catch_up_runs: int = DEFAULT_MAX_CATCH_UP_RUNS
    """``RUN_ALL`` only: the most occurrences one catch-up runs."""
    grace: datetime.timedelta = MISFIRE_GRACE


@dataclass(frozen=True)
class DuePlan:
    """What a dispatcher does with a schedule at one instant."""

    runs: tuple[datetime.datetime, ...]
    """Scheduled times (UTC) that become jobs now, oldest first."""
    next_at: datetime.datetime | None
    """The occurrence to wait for afterwards; None once a schedule has no more."""


@functools.cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _MACHINE_ZONES


def parse_time_zone(name: str) -> str:
    """The IANA zone name, checked against the tz database (tzdata ships it everywhere)."""
    if name not in _known_zones():
        raise ScheduleError("time_zone", f"{name!r} is not an IANA time zone such as 'Europe/Berlin'")
    return name


def parse_cron(expression: str) -> str:
    """The expression normalised to single spaces, or the reason it can never run."""
    fields = expression.split()
    if len(fields) != 5:
        raise ScheduleError("cron", f"needs 5 fields (minute hour day-of-month month day-of-week), "
                                    f"got {len(fields)}")
    for name, text in zip(_CRON_FIELDS, fields):
        if not all(_CRON_TERM.match(term) for term in text.split(",")):
            raise ScheduleError("cron", f"{name} field {text!r} is not in the 5-field Unix dialect")
    normal = " ".join(fields)
    try:
        sim = CronSim(normal, datetime.datetime(2000, 1, 1))
        next(sim)
    except CronSimError as exc:
        reason = str(exc).lower()
        if reason == "bad day-of-month":
            reason += " (out of range, or a day none of its months has)"
        raise ScheduleError("cron", f"{normal!r}: {reason}") from None
    except StopIteration:
        raise ScheduleError("cron", f"{normal!r} matches no date") from None
    return normal


def parse_run_at(value: datetime.datetime) -> datetime.datetime:
    """A local wall time, whole seconds, without an offset (the zone gives it one)."""
    if value.tzinfo is not None:
        raise ScheduleError("run_at", "give the local time without an offset; time_zone says where")
    if value.microsecond:
        raise ScheduleError("run_at", "whole seconds only")
    # Far enough from datetime's limits that no zone's offset carries the
    # instant out of range.
    if not _RUN_AT_YEARS[0] <= value.year <= _RUN_AT_YEARS[1]:
        raise ScheduleError("run_at", f"the year must be between {_RUN_AT_YEARS[0]} and "
                                      f"{_RUN_AT_YEARS[1]}")
    return value


def once(run_at: datetime.datetime, time_zone: str) -> Timing:
    return Timing(ScheduleKind.ONCE, parse_time_zone(time_zone), run_at=parse_run_at(run_at))


def cron(expression: str, time_zone: str) -> Timing:
    return Timing(ScheduleKind.CRON, parse_time_zone(time_zone), cron=parse_cron(expression))


def resolve_wall_time(wall: datetime.datetime, zone: zoneinfo.ZoneInfo) -> datetime.datetime:
    """The instant (UTC) a local wall time runs at, by the gap and overlap rule."""
    # fold=0 is the first of two occurrences in an overlap: exactly the rule.
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # In a gap, fold=0 reads the wall time with the offset from before the
    # transition (an instant past it) and fold=1 with the one after (an instant
    # before it); the transition, the first instant after the gap, lies between.
    early = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    after_offset = first.astimezone(zone).utcoffset()
    low, high = early, first
    while high - low > datetime.timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == after_offset:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


# Memoized: a burst is thousands of schedules with the same expression and
# zone due at the same instant (benchmarks/schedules.py), and the dispatcher
# plans each one; the cron walk was half of a pass's time. Pure, so safe.
@functools.lru_cache(maxsize=4096)
def first_after(timing: Timing, after: datetime.datetime) -> datetime.datetime | None:
    """The earliest occurrence strictly after the instant ``after``; None if there is none."""
    zone = timing.zone
    if timing.kind is ScheduleKind.ONCE:
        assert timing.run_at is not None
        at = resolve_wall_time(timing.run_at, zone)
        return at if at > after else None
    assert timing.cron is not None
    # Walking wall times from the wall time of ``after`` misses nothing: the
    # rule maps later wall times to instants that never go backwards. Wall
    # times that land at or before ``after`` (the second pass of an overlap,
    # several gap times sharing the gap's end) are passed over.
    wall_start = after.astimezone(zone).replace(tzinfo=None)
    for wall in CronSim(timing.cron, wall_start):
        at = resolve_wall_time(wall, zone)
        if at > after:
            return at
    return None


def first_occurrence(timing: Timing, now: datetime.datetime) -> datetime.datetime:
    """The occurrence a new (or replaced) schedule waits for.

    A ``ONCE`` time already past is kept, so the misfire policy decides whether
    it still runs; a cron schedule starts with its first occurrence after now.
    """
    if timing.kind is ScheduleKind.ONCE:
        assert timing.run_at is not None
        return resolve_wall_time(timing.run_at, timing.zone)
    at = first_after(timing, now)
    # parse_cron refused every expression that matches no date.
    assert at is not None
    return at


def _at_or_after(timing: Timing, instant: datetime.datetime) -> datetime.datetime | None:
    return first_after(timing, instant - _JUST_BEFORE)


def _between(timing: Timing, low: datetime.datetime, high: datetime.datetime,
             limit: int | None = None) -> tuple[datetime.datetime, ...]:
    """Occurrences in [low, high], the last ``limit`` of them when given."""
    found: deque[datetime.datetime] = deque(maxlen=limit)
    at = _at_or_after(timing, low)
    while at is not None and at <= high:
        found.append(at)
        at = first_after(timing, at)
    return tuple(found)


def _last_due(timing: Timing, floor: datetime.datetime, horizon: datetime.datetime,
              count: int) -> tuple[datetime.datetime, ...]:
    """The last ``count`` occurrences in [floor, horizon]."""
    for span in _SEARCH_SPANS:
        low = floor if span is None else max(floor, horizon - span)
        found = _between(timing, low, horizon, count)
        if len(found) == count or low == floor:
            return found
    raise AssertionError("the last search span starts at the floor")


DISPATCH_MARGIN_MILLIS = 1000
"""What a window keeps free at its end for the dispatcher's poll and pass."""


def dispatch_offset(schedule_id: ScheduleId, window_seconds: int) -> datetime.timedelta:
    """Where in its window every run of a schedule starts: a hash of its id, not a
    random draw, so a restart or a reload never gives one run two start times.

    The hash spreads runs over the window less its last second (its last half, for a
    window under two seconds): a run due at the very end would otherwise start past
    it, one dispatcher poll and one pass late."""
    if window_seconds <= 0:
        return datetime.timedelta(0)
    window_millis = window_seconds * 1000
    span = window_millis - min(DISPATCH_MARGIN_MILLIS, window_millis // 2)
    digest = hashlib.sha256(str(schedule_id).encode()).digest()
    millis = int.from_bytes(digest[:8], "big") % span
    return datetime.timedelta(milliseconds=millis)


def idempotency_key(schedule_id: ScheduleId, scheduled_for: datetime.datetime) -> str:
    """The same for every attempt of one run, different for the next run."""
    utc = scheduled_for.astimezone(UTC)
    return f"{schedule_id}:{utc:%Y-%m-%dT%H:%M:%SZ}"


def plan_due(timing: Timing, *, next_at: datetime.datetime, offset: datetime.timedelta,
             misfire: MisfireRule, now: datetime.datetime) -> DuePlan:
    """The runs due at ``now`` from the pending occurrence ``next_at`` on, and what follows.

    An occurrence is due once ``now`` reaches it plus its dispatch offset; it was
    missed if ``now`` is more than the grace past that. Usually one occurrence
    is due and on time; after an outage or a pause the policy picks among them.
    """
    horizon = now - offset
    if next_at > horizon:
        return DuePlan(runs=(), next_at=next_at)
    if misfire.policy is MisfirePolicy.SKIP:
        runs = _between(timing, max(next_at, horizon - misfire.grace), horizon)
    elif misfire.policy is MisfirePolicy.RUN_ONCE:
        runs = _last_due(timing, next_at, horizon, 1)
    else:
        runs = _last_due(timing, next_at, horizon, misfire.max_catch_up_runs)
    # The occurrence after the last due one is the first after the horizon:
    # none lies between them.
    return DuePlan(runs=runs, next_at=first_after(timing, horizon))
