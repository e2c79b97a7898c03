"""Clocks handed to the domain code, which never reads time itself.

``WallClock`` is for what people read (condition timestamps); lease logic is
given a monotonic clock, because wall time can jump and may differ between
machines.
"""

from __future__ import annotations

import datetime
import time
from typing import Protocol

__all__ = ["Clock", "WallClock", "MonotonicClock", "SystemClock"]


class WallClock(Protocol):
    def now(self) -> datetime.datetime: ...


class MonotonicClock(Protocol):
    def monotonic(self) -> float: ...


class Clock(WallClock, MonotonicClock, Protocol):
    """Both kinds of time, as a real process has them."""


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()
